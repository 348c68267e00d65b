// The Qwen3.5 bridge's reference preprocessing, compiled from ggk 0.9.7's own lines
// (bridge_refs.inc: Qwen35BridgeEmbedder::get_learned_condition, from the picture's size to the
// 2x-1 RGB the vision tower takes, cut verbatim from conditioner.hpp) over core/tensor.hpp's
// sd::ops::interpolate. stdin: W*H*C f32 in [0,1] (x fastest, then y, then channel);
// args: W H C MAX_PIXELS. Prints "w_bar h_bar" on stderr, writes the 3*w_bar*h_bar rgb on stdout.
#include "core/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: ref_probe W H C MAX_PIXELS < in.f32 > rgb.f32\n");
        return 2;
    }
    const int64_t W = atoll(argv[1]), H = atoll(argv[2]), C = atoll(argv[3]);
    std::vector<float> buf(static_cast<size_t>(W * H * C));
    if (fread(buf.data(), sizeof(float), buf.size(), stdin) != buf.size()) {
        return 3;
    }
    const sd::Tensor<float> image({W, H, C, 1}, buf);
    const int64_t factor     = 16 * 2;  // the Qwen3.5 tower's patch_size x spatial_merge_size
    const int64_t min_pixels = 65536;
    int64_t max_pixels       = atoll(argv[4]);
#include "bridge_refs.inc"
    fprintf(stderr, "%lld %lld\n", static_cast<long long>(w_bar), static_cast<long long>(h_bar));
    fwrite(rgb.data(), sizeof(float), static_cast<size_t>(rgb.numel()), stdout);
    return 0;
}
