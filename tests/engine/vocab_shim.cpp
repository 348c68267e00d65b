// The two vocabularies the driver needs, taken from the engine's own headers exactly as
// tokenizers/vocab/vocab.cpp serves them (no injected tokenizer pack): the Qwen2 merges and the
// T5 tokenizer.json. The rest of vocab.cpp (Gemma, Mistral, UMT5, ... tens of MB) is not built.
#include <string>

#include "qwen_merges.hpp"
#include "t5.hpp"

std::string load_qwen2_merges() {
    return std::string(reinterpret_cast<const char*>(qwen2_merges_utf8_c_str), sizeof(qwen2_merges_utf8_c_str));
}

std::string load_t5_tokenizer_json() {
    return std::string(reinterpret_cast<const char*>(t5_tokenizer_json_str), sizeof(t5_tokenizer_json_str));
}

std::string load_umt5_tokenizer_json() { return std::string(); }  // declared by vocab.h, unused here
