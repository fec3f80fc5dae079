// impl.decode._onepass_nogil_avx2: module.cpp built for x86-64-v3 CPUs (AVX2, BMI1/2,
// LZCNT) with PCLMUL: setup.py compiles this file with -march=x86-64-v3 -mpclmul. The walk's
// 64-byte blocks then take two 32-byte vectors instead of four 16-byte ones, and each prefix
// XOR (which bytes are in strings, in objects) is one carry-less multiply instead of six
// shifts. impl/decode/onepass_nogil_avx2.py imports it only on a CPU the baseline module says
// can run it: its code may use those instructions anywhere, even while the module loads.
#define HOTPATH_AVX2_BUILD 1
#include "module.cpp"
