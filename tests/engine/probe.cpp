// The engine tier's driver: feeds ggk 0.9.7's own code and prints what it returns, one line per
// command read from stdin (text arguments hex-encoded UTF-8, so any prompt fits on a line):
//   parse HEX                      parse_prompt_attention: "weight:HEX ..." per chunk ("-" = "")
//   qwen HEX / t5 HEX              Qwen2Tokenizer / T5UniGramTokenizer ids of one text
//   pixart L HEX                   PixArtT5Embedder's student ids | its T5 window of L slots
//   cspace                         the code points 256..0x3FFFF that tokenize_util.cpp's isspace(char32_t)
//                                  reads as space: a lookup past the C library's 256-entry table
//                                  (undefined behaviour; glibc answers from whatever follows it)
//   t5json PATH                    writes the engine's T5 tokenizer.json (its pieces and scores)
//   tmpl PACK HEX N H1 W1 ...      the pack's template code cut from conditioner.hpp (snippets.inc),
//                                  with N reference images of H×W pixels, then LLMEmbedder::tokenize:
//                                  "start S | ids | idx:n ... | h_bar:w_bar ... | real R | layers ... |
//                                  min M | max X | hsmin H" (see answer()) or "throw MESSAGE";
//                                  the pack citing fibo2.hpp runs Fibo2Probe instead. The pixels
//                                  are 8-bit noise: value(k) = ((k · 2654435761) mod 2³² >> 24) / 255
//                                  at the flat index k = x + W·(y + H·c); with SD_DUMP_COND set,
//                                  Fibo 2.0's own dump writes what its vision tower gets
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/util.h"
#include "json.hpp"
#include "model.h"
#include "tokenizers/qwen2_tokenizer.h"
#include "tokenizers/t5_unigram_tokenizer.h"
#include "tokenizers/vocab/vocab.h"

static std::string unhex(const std::string& h) {
    std::string out;
    if (h == "-") {  // the empty text
        return out;
    }
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
        out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
    }
    return out;
}

static std::string hex(const std::string& s) {
    static const char* d = "0123456789abcdef";
    std::string out;
    for (unsigned char c : s) {
        out.push_back(d[c >> 4]);
        out.push_back(d[c & 15]);
    }
    return out;
}

static std::string ids_text(const std::vector<int>& ids) {
    std::string out;
    for (size_t i = 0; i < ids.size(); ++i) {
        out += (i ? " " : "") + std::to_string(ids[i]);
    }
    return out;
}

// What the template code reads from the student LLM: the vision config and the image encoder.
// The fake encoder returns one row per merged 32×32 cell of the preprocessed picture (Qwen3-VL:
// patch 16, merge 2), and records the size clip_preprocess produced.
struct FakeLLM {
    struct {
        struct {
            int patch_size         = 16;
            int spatial_merge_size = 2;
            bool use_deepstack     = true;  // Qwen Image 2.1 (conditioner.hpp 3073)
        } vision;
        int num_layers = 36;  // Qwen Image 2.1: out_layers = {num_layers} (3084)
    } config;
    bool enable_vision = true;
    std::vector<std::pair<int64_t, int64_t>> seen;  // (h_bar, w_bar) of each preprocessed image

    sd::Tensor<float> encode_image(int, const sd::Tensor<float>& image, bool, bool, bool) {
        int64_t w = image.shape()[0], h = image.shape()[1];
        seen.emplace_back(h, w);
        return sd::Tensor<float>({4, (w / 32) * (h / 32)});
    }
    // Qwen Image 2.1's call (3123) with the deepstack output (none here: the adapter path)
    sd::Tensor<float> encode_image(int t, const sd::Tensor<float>& image, bool a, bool b, bool c,
                                   std::vector<sd::Tensor<float>>*) {
        return encode_image(t, image, a, b, c);
    }
};

// What Qwen Image 2.1's branch reads besides the LLM: the deepstack extras of the full-teacher
// path and the adapter's vision flags (conditioner.hpp 3061, 3122-3139); the driver plays
// pig_clip + a vision-ext adapter, the path a trained adapter takes.
namespace LLM {
struct LLMImageExtra {
    std::vector<sd::Tensor<float>> deepstack;
    int grid_h = 0;
    int grid_w = 0;
};
}  // namespace LLM

struct FakeAdapter {
    struct {
        bool has_vision_proj = true;
        bool has_vis_in      = true;
    } config;
};

// What Fibo2Conditioner reads of the reference-image settings: the "fibo2" preset's values
// (model/diffusion/model.hpp 46-58; the tier checks them there), the type as model.hpp 13-17.
enum class RefImageResizeMode { NONE, LONGEST_SIDE, AREA };
struct RefImageParams {
    RefImageResizeMode vlm_resize_mode = RefImageResizeMode::LONGEST_SIDE;
    int vlm_max_size                   = 768;
};

struct Params {
    std::string text;
    const std::vector<sd::Tensor<float>>* ref_images = nullptr;
    RefImageParams ref_image_params;
};

// The `tmpl` answer: what LLMEmbedder::encode_prompt is handed (conditioner.hpp 2625-2637) once the
// template code ran: "start S | ids | idx:n ... | h_bar:w_bar ... | real R | layers a b ... | min M |
// max X | hsmin H" (R: the ids before tokenize's pads, its mask's ones; layers: out_layers, the
// teacher taps the DiT reads, none = the final norm; M, X: the min_length / max_length handed to
// tokenize; H: hidden_states_min_length, the zero rows encode_prompt appends after the adapter).
static std::string answer(int start,
                          const std::tuple<std::vector<int>, std::vector<float>, std::vector<float>>& twm,
                          const std::vector<std::pair<int, sd::Tensor<float>>>& image_embeds,
                          const std::vector<std::pair<int64_t, int64_t>>& seen,
                          const std::set<int>& out_layers,
                          int min_length,
                          int max_length,
                          int hidden_states_min_length) {
    const auto& ids  = std::get<0>(twm);
    const auto& mask = std::get<2>(twm);
    std::string out  = "start " + std::to_string(start) + " | " + ids_text(ids) + " |";
    for (auto& e : image_embeds) {
        out += " " + std::to_string(e.first) + ":" + std::to_string(e.second.shape()[1]);
    }
    out += " |";
    for (auto& s : seen) {
        out += " " + std::to_string(s.first) + ":" + std::to_string(s.second);
    }
    size_t real = mask.empty() ? ids.size() : 0;
    for (float m : mask) {
        real += m != 0.f;
    }
    out += " | real " + std::to_string(real) + " | layers";
    for (int l : out_layers) {
        out += " " + std::to_string(l);
    }
    out += " | min " + std::to_string(min_length) + " | max " + std::to_string(max_length) +
           " | hsmin " + std::to_string(hidden_states_min_length);
    return out;
}

struct Embedder {
    std::shared_ptr<BPETokenizer> tokenizer = std::make_shared<Qwen2Tokenizer>();
    SDVersion version                       = VERSION_COUNT;

#include "tokenize_member.inc"  // LLMEmbedder::tokenize, cut from conditioner.hpp

    std::string run(const std::string& pack, const Params& conditioner_params) {
        std::string prompt;
        std::pair<int, int> prompt_attn_range;
        std::vector<std::string> extra_prompts;  // the locals of LLMEmbedder::get_learned_condition
        std::vector<std::pair<int, int>> extra_prompts_attn_range;
        std::vector<std::pair<int, sd::Tensor<float>>> image_embeds;
        sd::Tensor<float> text_mask;
        int prompt_template_encode_start_idx = 34;
        int min_length                       = 0;
        int max_length                       = 100000000;
        int hidden_states_min_length         = 0;
        bool spell_quotes                    = false;
        std::string prompt_suffix;
        std::set<int> out_layers;
        std::vector<LLM::LLMImageExtra> image_extras;  // Qwen Image 2.1 (conditioner.hpp 2936)
        FakeAdapter adapter;
        FakeAdapter* llm_adapter = &adapter;
        int n_threads = 1;
        auto llm      = std::make_shared<FakeLLM>();
        (void)n_threads;
        (void)extra_prompts_attn_range;
#include "snippets.inc"  // each pack's template branch, cut from conditioner.hpp at its cited lines
        // as LLMEmbedder::encode_prompt calls it (conditioner.hpp 2642)
        auto tokens_weights_mask = tokenize(prompt, prompt_attn_range, min_length, max_length, spell_quotes, prompt_suffix);
        return answer(prompt_template_encode_start_idx, tokens_weights_mask, image_embeds, llm->seen, out_layers,
                      min_length, max_length, hidden_states_min_length);
    }
};

#include "fibo2_pack.inc"  // FIBO2_PACK, FIBO2_VERSION: the pack citing fibo2.hpp, if any
#ifdef FIBO2_PACK
// Fibo2Conditioner's template (fibo2.hpp): its members (format_prompt and the helpers it calls,
// resize_8bit, the constants its encode_prompt call reads), then get_learned_condition from its
// image count through the reference-image loop and the encode_prompt call, all cut at the lines
// the pack cites. The loop runs on FakeLLM (its tower sizes) and the adapter path (a vision-ext
// adapter: no deepstack); the call lands on this encode_prompt, which runs LLMEmbedder::tokenize
// with the arguments the engine passes and prints what `tmpl` prints.
struct Fibo2Probe : Embedder {
    std::shared_ptr<FakeLLM> llm;
    FakeAdapter adapter;
    FakeAdapter* llm_adapter = &adapter;
#include "fibo2_members.inc"

    std::string encode_prompt(int,
                              const std::string prompt,
                              const std::pair<int, int>& prompt_attn_range,
                              int min_length,
                              int hidden_states_min_length,
                              const std::vector<std::pair<int, sd::Tensor<float>>>& image_embeds,
                              const std::set<int>& out_layers,
                              int prompt_template_encode_start_idx,
                              bool spell_quotes                                   = false,
                              int max_length                                      = 100000000,
                              const std::vector<LLM::LLMImageExtra>*              = nullptr,
                              const std::string& prompt_suffix                    = "") {
        auto tokens_weights_mask = tokenize(prompt, prompt_attn_range, min_length, max_length, spell_quotes, prompt_suffix);
        return answer(prompt_template_encode_start_idx, tokens_weights_mask, image_embeds, llm->seen, out_layers,
                      min_length, max_length, hidden_states_min_length);
    }

    std::string run(const Params& p) {
        version = FIBO2_VERSION;
        llm     = std::make_shared<FakeLLM>();
        // the locals of Fibo2Conditioner::get_learned_condition the cut lines do not declare
        int n_threads = 1;
#include "fibo2_body.inc"  // image_count ... the reference-image loop; auto states = encode_prompt(...);
        return states;
    }
};
#endif

int main() {
    Qwen2Tokenizer qwen;
    T5UniGramTokenizer t5;
    Embedder embedder;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd;
        in >> cmd;
        try {
            if (cmd == "parse") {
                std::string h;
                in >> h;
                std::string out;
                for (auto& item : parse_prompt_attention(unhex(h))) {
                    char w[64];
                    snprintf(w, sizeof(w), "%.9g", item.second);
                    out += std::string(out.empty() ? "" : " ") + w + ":" + hex(item.first);
                }
                std::cout << out << "\n";
            } else if (cmd == "qwen" || cmd == "t5") {
                std::string h;
                in >> h;
                std::cout << ids_text(cmd == "qwen" ? qwen.tokenize(unhex(h), nullptr) : t5.encode(unhex(h))) << "\n";
            } else if (cmd == "pixart") {
                // PixArtT5Embedder::compute_qwen_hidden's ids and get_learned_condition's T5 window,
                // composed of the engine's functions in the order conditioner.hpp calls them (1781-1799, 1802-1890)
                size_t length;
                std::string h;
                in >> length >> h;
                auto parsed = parse_prompt_attention(unhex(h));
                std::vector<int> student, tokens;
                std::vector<float> weights, mask;
                for (auto& item : parsed) {
                    auto cur = qwen.tokenize(item.first, nullptr);
                    student.insert(student.end(), cur.begin(), cur.end());
                    auto chunk = t5.encode(item.first);
                    tokens.insert(tokens.end(), chunk.begin(), chunk.end());
                    weights.insert(weights.end(), chunk.size(), item.second);
                }
                if (student.empty()) {
                    student.push_back(151643);
                }
                t5.pad_tokens(tokens, &weights, &mask, length, length, false);
                std::cout << ids_text(student) << " | " << ids_text(tokens) << "\n";
            } else if (cmd == "cspace") {
                std::string out;
                for (long cp = 256; cp <= 0x3FFFF; ++cp) {
                    if (isspace(static_cast<char32_t>(cp))) {  // exactly as token_split calls it
                        out += (out.empty() ? "" : " ") + std::to_string(cp);
                    }
                }
                std::cout << out << "\n";
            } else if (cmd == "t5json") {
                std::string path;
                in >> path;
                std::string json = load_t5_tokenizer_json();
                FILE* f          = fopen(path.c_str(), "wb");
                fwrite(json.data(), 1, json.size(), f);
                fclose(f);
                std::cout << json.size() << "\n";
            } else if (cmd == "tmpl") {
                std::string pack, h;
                int n = 0;
                in >> pack >> h >> n;
                std::vector<sd::Tensor<float>> images;
                for (int i = 0; i < n; ++i) {
                    int64_t ih, iw;
                    in >> ih >> iw;
                    images.push_back(sd::Tensor<float>({iw, ih, 3, 1}));
                    for (int64_t k = 0; k < images.back().numel(); ++k) {  // 8-bit noise
                        images.back()[k] = static_cast<float>((static_cast<uint32_t>(k) * 2654435761u) >> 24) / 255.f;
                    }
                }
                Params p;
                p.text       = unhex(h);
                p.ref_images = n ? &images : nullptr;
#ifdef FIBO2_PACK
                if (pack == FIBO2_PACK) {
                    static Fibo2Probe fibo2;  // one tokenizer: building it costs ~0.4 s
                    std::cout << fibo2.run(p) << "\n";
                } else
#endif
                    std::cout << embedder.run(pack, p) << "\n";
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
