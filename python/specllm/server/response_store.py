"""The responses /v1/responses keeps, so that a request can go on from one by its id (previous_response_id) and a
client can read one again (GET /v1/responses/{id}), list its input items (GET /v1/responses/{id}/input_items) or
delete it: in memory, the newest `max_responses` (least recently used out first), until the server stops. Each holds
its conversation as chat messages (without the instructions, which OpenAI does not carry over to the next
response), its input items (those of the responses it went on from and their output, then its own) and its
Response body. An item of a kept response can be named by its id (an `item_reference` input item). `store: false`
keeps nothing."""
from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from typing import List, Optional, Tuple

MAX_RESPONSES = 256


class ResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES):
        self.max_responses = max_responses
        # id: (conversation, body, input items)
        self._kept: "OrderedDict[str, Tuple[List[dict], dict, List[dict]]]" = OrderedDict()
        self._lock = threading.Lock()

    def put(self, rid: str, conversation: List[dict], body: dict, items: List[dict]) -> None:
        with self._lock:
            self._kept[rid] = (copy.deepcopy(conversation), copy.deepcopy(body), copy.deepcopy(items))
            self._kept.move_to_end(rid)
            while len(self._kept) > self.max_responses:
                self._kept.popitem(last=False)

    def context(self, rid: str) -> Optional[Tuple[List[dict], List[dict]]]:
        """A copy of what a request that goes on from the response starts with: (its conversation: its messages and
        its reply; its items: its input items and its output), or None."""
        with self._lock:
            kept = self._kept.get(rid)
            if kept is None:
                return None
            self._kept.move_to_end(rid)
            return copy.deepcopy(kept[0]), copy.deepcopy(kept[2] + kept[1]["output"])

    def input_items(self, rid: str) -> Optional[List[dict]]:
        """A copy of the response's input items, oldest first, or None."""
        with self._lock:
            kept = self._kept.get(rid)
            return None if kept is None else copy.deepcopy(kept[2])

    def item(self, item_id: str) -> Optional[dict]:
        """A copy of the item with this id among the kept responses' input items and output (newest first), or
        None."""
        with self._lock:
            for _, body, items in reversed(self._kept.values()):
                for item in reversed(items + body["output"]):
                    if item.get("id") == item_id:
                        return copy.deepcopy(item)
        return None

    def body(self, rid: str) -> Optional[dict]:
        with self._lock:
            kept = self._kept.get(rid)
            return None if kept is None else copy.deepcopy(kept[1])

    def delete(self, rid: str) -> bool:
        with self._lock:
            return self._kept.pop(rid, None) is not None

    def __len__(self) -> int:
        return len(self._kept)
