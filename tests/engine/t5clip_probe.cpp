// The engine tier's driver for T5CLIPEmbedder (Chroma: T5 v1.1; Wan: UMT5), one line per command
// read from stdin (text hex-encoded UTF-8, "-" = ""). The seed window ggk 0.9.7 feeds an adapter
// is composed of the engine's functions in the order the embedder calls them: tokenize
// (conditioner.hpp 1356-1393: each weight chunk's ids, then pad_tokens to chunk_len with
// allow_overflow_expand), get_learned_condition_common (1427-1434: the adapter keeps the first
// chunk_len ids), get_learned_condition (1543: min = max = chunk_len).
//   t5clip L HEX     the T5 v1.1 window of L slots (T5UniGramTokenizer(false))
//   umt5 L HEX       the UMT5 window of L slots (T5UniGramTokenizer(true), the engine's UMT5 vocab)
//   json t5|umt5 PATH  writes the engine's T5 or UMT5 tokenizer.json (its pieces and scores)
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "core/util.h"
#include "tokenizers/t5_unigram_tokenizer.h"
#include "tokenizers/vocab/vocab.h"

static std::string unhex(const std::string& h) {
    std::string out;
    if (h == "-") {
        return out;
    }
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
}

static std::string window(T5UniGramTokenizer& tok, size_t chunk_len, const std::string& text) {
    std::vector<int> tokens;
    std::vector<float> weights, mask;
    for (const auto& item : parse_prompt_attention(text)) {
        std::vector<int> cur = tok.encode(item.first);
        tokens.insert(tokens.end(), cur.begin(), cur.end());
        weights.insert(weights.end(), cur.size(), item.second);
    }
    tok.pad_tokens(tokens, &weights, &mask, chunk_len, chunk_len, true);
    if (tokens.size() > chunk_len) {  // the adapter's fixed window: the first chunk
        tokens.resize(chunk_len);
    }
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
        out += (i ? " " : "") + std::to_string(tokens[i]);
    }
    return out;
}

int main() {
    T5UniGramTokenizer t5(false);
    T5UniGramTokenizer umt5(true);
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        try {
            if (cmd == "t5clip" || cmd == "umt5") {
                size_t length;
                std::string h;
                in >> length >> h;
                std::cout << window(cmd == "umt5" ? umt5 : t5, length, unhex(h)) << "\n";
            } else if (cmd == "json") {
                std::string which, path;
                in >> which >> path;
                std::string json = which == "umt5" ? load_umt5_tokenizer_json() : load_t5_tokenizer_json();
                FILE* f          = fopen(path.c_str(), "wb");
                fwrite(json.data(), 1, json.size(), f);
                fclose(f);
                std::cout << json.size() << "\n";
            } else {
                std::cout << "error unknown command " << cmd << "\n";
            }
        } catch (const std::exception& e) {
            std::string msg = e.what();
            for (auto& c : msg) {
                if (c == '\n') c = ' ';
            }
            std::cout << "throw " << msg << "\n";
        }
        std::cout.flush();
    }
    return 0;
}
