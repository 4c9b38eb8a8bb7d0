// Times bitnet.cpp's I2_S GEMV kernel (ggml_vec_dot_i2_i8_s, one weight row per call as ggml's
// mul_mat calls it for one activation row) over cold copies of a rows x K matrix, T threads.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <vector>
#include <chrono>
#include <algorithm>
#include <omp.h>
void ggml_vec_dot_i2_i8_s(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
int main(int argc, char ** argv) {
    int rows = atoi(argv[1]), K = atoi(argv[2]), T = atoi(argv[3]);
    size_t cold_mib = argc > 4 ? atol(argv[4]) : 1024;
    size_t wbytes = (size_t) rows * K / 4;
    size_t copies = std::max<size_t>(1, (cold_mib << 20) / wbytes + 1);
    std::vector<std::vector<uint8_t>> w(copies, std::vector<uint8_t>(wbytes));
    uint64_t st = 88172645463325252ull;
    auto rnd = [&]() { st ^= st << 13; st ^= st >> 7; st ^= st << 17; return st; };
    for (auto & c : w) for (auto & b : c) { uint8_t v = 0; for (int g = 0; g < 4; g++) v |= (rnd() % 3) << (2 * g); b = v; }
    std::vector<int8_t> y(K);
    for (auto & v : y) v = (int8_t) (rnd() % 255 - 127);
    std::vector<float> out(rows);
    omp_set_num_threads(T);
    std::vector<double> ts;
    size_t calls = 0;
    auto t_end = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    while (std::chrono::steady_clock::now() < t_end || calls < 20) {
        const uint8_t * x = w[calls % copies].data();
        auto t0 = std::chrono::steady_clock::now();
        #pragma omp parallel for schedule(static)
        for (int r = 0; r < rows; r++)
            ggml_vec_dot_i2_i8_s(K, &out[r], 0, x + (size_t) r * K / 4, 0, y.data(), 0, 1);
        ts.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        calls++;
    }
    std::sort(ts.begin(), ts.end());
    double med = ts[ts.size() / 2];
    printf("bitnet.cpp i2_s %dx%d T=%d: median %.1f us, %.2f GB/s, %.1f GF/s (%zu calls, %zu copies)\n",
           rows, K, T, med * 1e6, wbytes / med / 1e9, 2.0 * rows * K / med / 1e9, calls, copies);
    return (int) out[0] == 12345;
}
