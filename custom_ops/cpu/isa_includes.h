// Headers the tile kernels need, included *outside* the ISA namespaces.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/fp16.h"
#include "cpu/isa.h"
