// The vocabularies t5clip_probe needs, from the engine's own headers as tokenizers/vocab/vocab.cpp
// serves them: the T5 v1.1 and the UMT5 tokenizer.json (umt5.hpp: 45 MB of source, ~35 s at -O0
// on 2 cores, which is why only this driver builds it). No other tokenizer runs here.
#include <stdexcept>
#include <string>

#include "t5.hpp"
#include "umt5.hpp"

std::string load_t5_tokenizer_json() {
    return std::string(reinterpret_cast<const char*>(t5_tokenizer_json_str), sizeof(t5_tokenizer_json_str));
}

std::string load_umt5_tokenizer_json() {
    return std::string(reinterpret_cast<const char*>(umt5_tokenizer_json_str), sizeof(umt5_tokenizer_json_str));
}

std::string load_qwen2_merges() {  // declared by vocab.h; the Qwen tokenizer is probe's
    throw std::runtime_error("t5clip_probe has no Qwen2 vocabulary");
}
