#pragma once
#include <cstdint>
#include <cstddef>
enum { GGML_TYPE_I2_S = 36 };
static inline size_t ggml_row_size(int, int64_t n) { return (size_t) n; }
