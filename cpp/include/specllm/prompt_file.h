// The file format of a prompt state on disk (PromptStore keeps the directory): a 40-byte header (magic "SPLKVST1",
// the model's identity u64, token count u32, 0 u32, state size u64, checksum u64), the tokens (u32 each), then the
// bytes of llama_state_seq_get_data. Named <identity>-<hash of the tokens>.kv, 16 hex digits each.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace specllm {

struct StateHeader {
    uint64_t identity = 0;
    uint32_t n_tokens = 0;
    uint64_t n_state = 0;
    uint64_t checksum = 0;
};

// the bytes of a state file holding n_tokens tokens and n_state bytes of state
size_t state_file_size(size_t n_tokens, size_t n_state);
// "<identity>-": the start of every state file name of one model
std::string state_name_prefix(uint64_t identity);
// the file name (no directory) of a state of these tokens
std::string state_file_name(uint64_t identity, const std::vector<llama_token> & tokens);
// <identity>-<tokens>.kv: 16 hex digits each
bool is_state_name(const std::string & name);
// the header read from in; false: not a state file of this format, or not as long as its header says
bool read_state_header(std::ifstream & in, uintmax_t file_size, StateHeader & h);
// the checksum of a state's tokens and bytes
uint64_t state_checksum(const std::vector<llama_token> & tokens, const uint8_t * state, size_t n_state);
// writes a new file at path (which must not exist: O_EXCL, mode 0600) holding the state; 0, or the errno of the
// first failure (the file is then left for the caller to remove)
int write_state_file(const std::string & path, uint64_t identity, const std::vector<llama_token> & tokens,
                     const std::vector<uint8_t> & state);

// the files of a model: a split GGUF's first file (<prefix>-00001-of-<count>.gguf) gives all <count>, in order; any
// other path gives itself
std::vector<std::string> split_model_files(const std::string & path);

// the identity of a model's states: each of its files' size, first MiB (the GGUF header: metadata, tensor types and
// shapes) and 64 KiB at 64 places over the rest, with the options that change the numbers a state holds
uint64_t prompt_store_identity(const std::string & model_path, const std::string & options);

} // namespace specllm
