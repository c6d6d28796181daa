"""The responses /v1/responses keeps, so that a request can go on from one by its id (previous_response_id) and a
client can read one again (GET /v1/responses/{id}) or delete it: in memory, the newest `max_responses` (least
recently used out first), until the server stops. Each holds its conversation as chat messages (without the
instructions, which OpenAI does not carry over to the next response) and its Response body. `store: false` keeps
nothing."""
from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import List, Optional, Tuple

MAX_RESPONSES = 256


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES):
        self.max_responses = max_responses
        self._items: "OrderedDict[str, Tuple[List[dict], dict]]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, conversation: List[dict], body: dict) -> None:
        with self._lock:
            self._items[rid] = (copy.deepcopy(conversation), copy.deepcopy(body))
            self._items.move_to_end(rid)
            while len(self._items) > self.max_responses:
                self._items.popitem(last=False)

    def conversation(self, rid: str) -> Optional[List[dict]]:
        """A copy of the response's conversation (its messages and its reply), or None."""
        with self._lock:
            item = self._items.get(rid)
            if item is None:
                return None
            self._items.move_to_end(rid)
            return copy.deepcopy(item[0])

    def body(self, rid: str) -> Optional[dict]:
        with self._lock:
            item = self._items.get(rid)
            return None if item is None else copy.deepcopy(item[1])

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._items.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._items)
