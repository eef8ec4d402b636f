// MLA latent cache kernels: write (quantize into the paged layer buffer),
// gather (dequantize through a block table) and copy_blocks.
//
// Compiled at run time by NVRTC, without any header: every conversion is done
// by hand on integer bit patterns so that the results equal the CPU codec bit
// for bit (round to nearest even, the same NaN and saturation rules). Float
// arithmetic is limited to operations that are exact or correctly rounded
// (IEEE division, multiplication by a power of two, fmaxf).
//
// Byte layouts of one token (R = kv_lora_rank, P = rope_dim; 512 and 64 for
// the DeepSeek family), specified exactly in docs/formats.md:
//   bf16        [0, 2R) R bf16 NoPE | [2R, 2R+2P) P bf16 RoPE
//   fp8_ds_mla  [0, R) e4m3fn codes | R/128 fp32 scales | P bf16 RoPE
//   mxfp6       [0, 3R/4) E2M3 codes, 6-bit little-endian bit stream |
//               R/32 UE8M0 scale bytes | P bf16 RoPE
//   nvfp4_ds_mla [0, R/2) E2M1 codes, two per byte (low nibble even) |
//               P e4m3 RoPE | R/16 e4m3 scales, transposed (see scale_byte)
//
// A layer buffer is [num_blocks][block_size][bytes_per_token], so a slot's
// bytes start at slot * bytes_per_token.
//
// Launch shape of write and gather: blockDim.x = 32 * WARPS_PER_BLOCK, one
// warp per token, gridDim.x = ceil(num_tokens / WARPS_PER_BLOCK).
//
// WARPS_PER_BLOCK and COPY_PAIRS_PER_LAUNCH are defined by the Rust side
// (kernel_defines in kernels.rs) and passed to the compiler as -D options.

#if !defined(WARPS_PER_BLOCK) || !defined(COPY_PAIRS_PER_LAUNCH)
#error "compile with -DWARPS_PER_BLOCK=... -DCOPY_PAIRS_PER_LAUNCH=... (see kernel_defines)"
#endif
#define FULL_MASK 0xffffffffu

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;

// ---------------------------------------------------------------------------
// Scalar conversions (bit patterns).

__device__ __forceinline__ float bits_f32(u32 b) { return __uint_as_float(b); }
__device__ __forceinline__ u32 f32_bits(float f) { return __float_as_uint(f); }

// bf16 -> f32, exact (bits shifted, NaN payloads kept).
__device__ __forceinline__ float bf16_to_f32(u16 h) { return bits_f32((u32)h << 16); }

// f32 -> bf16, round to nearest even; every NaN becomes 0x7fff. Overflow
// rounds to +-Inf.
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (u16)0x7fffu;
    return (u16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// f16 -> f32, exact (NaN payloads do not matter: every consumer maps NaN to
// one value).
__device__ __forceinline__ float f16_to_f32(u16 h) {
    u32 i = (u32)h;
    if ((i & 0x7fffu) == 0u) return bits_f32(i << 16);
    u32 sign = (i & 0x8000u) << 16;
    u32 exp = i & 0x7c00u;
    u32 man = i & 0x03ffu;
    if (exp == 0x7c00u) {
        if (man == 0u) return bits_f32(sign | 0x7f800000u);
        return bits_f32(sign | 0x7fc00000u | (man << 13));
    }
    if (exp == 0u) {
        // Subnormal: normalize. e = leading zeros of man as a 16-bit value - 6.
        u32 e = (u32)(__clz(man) - 16 - 6);
        u32 fexp = (127u - 15u - e) << 23;
        u32 fman = (man << (14u + e)) & 0x7fffffu;
        return bits_f32(sign | fexp | fman);
    }
    u32 fexp = ((exp >> 10) - 15u + 127u) << 23;
    return bits_f32(sign | fexp | (man << 13));
}

// Input element loaders, one per input dtype.
struct InBf16 {
    typedef u16 T;
    static __device__ __forceinline__ float to_f32(T v) { return bf16_to_f32(v); }
    // Values stored unquantized (bf16 format, RoPE) keep bf16 inputs verbatim.
    static __device__ __forceinline__ u16 to_bf16(T v) { return v; }
};
struct InF16 {
    typedef u16 T;
    static __device__ __forceinline__ float to_f32(T v) { return f16_to_f32(v); }
    static __device__ __forceinline__ u16 to_bf16(T v) { return f32_to_bf16(f16_to_f32(v)); }
};
struct InF32 {
    typedef float T;
    static __device__ __forceinline__ float to_f32(T v) { return v; }
    static __device__ __forceinline__ u16 to_bf16(T v) { return f32_to_bf16(v); }
};

// ceil(log2(v)), exactly, for a positive finite v (normal or subnormal).
__device__ __forceinline__ int ceil_log2_pos(float v) {
    u32 b = f32_bits(v) & 0x7fffffffu;
    int exp = (int)(b >> 23);
    u32 man = b & 0x7fffffu;
    if (exp == 0) {
        // v = man * 2^-149.
        u32 m1 = (man > 1u ? man : 1u) - 1u;
        return -149 + (32 - __clz(m1));
    }
    return exp - 127 + (man != 0u ? 1 : 0);
}

// 2^e as a float for e in [-149, 127].
__device__ __forceinline__ float exp2_int(int e) {
    if (e >= -126) return bits_f32((u32)(e + 127) << 23);
    return bits_f32(1u << (e + 149));
}

// Magnitude of a finite value as bits, 0 for NaN and +-Inf: the order of
// non-negative floats is the order of their bits.
__device__ __forceinline__ u32 finite_mag_bits(float v) {
    u32 b = f32_bits(v) & 0x7fffffffu;
    return b < 0x7f800000u ? b : 0u;
}

// Rounds |q| (q not NaN) to a float with MAN mantissa bits and exponent bias
// BIAS, saturating at max; returns the magnitude code.
template <u32 BIAS, u32 MAN>
__device__ __forceinline__ u32 round_magnitude(float q, float max) {
    float a = fminf(fabsf(q), max);
    u32 bits = f32_bits(a);
    // Normal range: round the f32 mantissa to MAN bits (nearest even) and
    // rebias the exponent; a carry moves into the exponent.
    const u32 drop = 23u - MAN;
    u32 normal = ((bits + ((1u << (drop - 1u)) - 1u) + ((bits >> drop) & 1u)) >> drop) - ((127u - BIAS) << MAN);
    // Subnormal range: adding 2^(24 - MAN - BIAS) rounds a (nearest even) to
    // a multiple of the subnormal quantum 2^(1 - MAN - BIAS); the low bits
    // are the code (2^MAN is the smallest normal, which is right).
    float magic = bits_f32((127u + 24u - MAN - BIAS) << 23);
    u32 subnormal = f32_bits(__fadd_rn(a, magic)) - f32_bits(magic);
    float min_normal = bits_f32((128u - BIAS) << 23);
    return a < min_normal ? subnormal : normal;
}

// f32 -> float8 e4m3fn, round to nearest even, saturating to +-448; NaN
// encodes as +0, +-Inf as +-448. Never produces a NaN code.
__device__ __forceinline__ u32 f32_to_e4m3(float q) {
    if (q != q) q = 0.0f;
    u32 sign = (f32_bits(q) >> 24) & 0x80u;
    return sign | round_magnitude<7, 3>(q, 448.0f);
}

// f32 -> float8 e4m3fn as cvt.rn.satfinite.e4m3x2.f32: as f32_to_e4m3, but
// NaN encodes as NaN (0x7f with the input's sign).
__device__ __forceinline__ u32 f32_to_e4m3_satfinite(float q) {
    if (q != q) return 0x7fu | ((f32_bits(q) >> 24) & 0x80u);
    return f32_to_e4m3(q);
}

// float8 e4m3fn -> f32, exact; 0x7f and 0xff decode to the NaN 0x7fc00000.
__device__ __forceinline__ float e4m3_to_f32(u32 c) {
    if ((c & 0x7fu) == 0x7fu) return bits_f32(0x7fc00000u);
    float mag = __fmul_rn(bits_f32((c & 0x7fu) << 20), bits_f32((127u + 120u) << 23));
    return bits_f32(f32_bits(mag) | ((c & 0x80u) << 24));
}

// f32 -> 6-bit E2M3 (bit 5 sign, bits 4:3 exponent, bits 2:0 mantissa),
// round to nearest even, saturating to +-7.5; NaN encodes as +0, +-Inf as
// +-7.5.
__device__ __forceinline__ u32 f32_to_e2m3(float q) {
    if (q != q) q = 0.0f;
    u32 sign = (f32_bits(q) >> 26) & 0x20u;
    return sign | round_magnitude<1, 3>(q, 7.5f);
}

// 6-bit E2M3 -> f32, exact.
__device__ __forceinline__ float e2m3_to_f32(u32 c) {
    float mag = __fmul_rn(bits_f32((c & 0x1fu) << 20), bits_f32((127u + 126u) << 23));
    return bits_f32(f32_bits(mag) | ((c & 0x20u) << 26));
}

// f32 -> 4-bit E2M1 (bit 3 sign, bits 2:1 exponent, bit 0 mantissa) as
// cvt.rn.satfinite.e2m1x2.f32: round to nearest even, saturating to +-6, the
// sign kept for zeros and underflows, NaN encoded as +6.
__device__ __forceinline__ u32 f32_to_e2m1(float q) {
    if (q != q) return 0x7u;
    u32 sign = (f32_bits(q) >> 28) & 0x8u;
    return sign | round_magnitude<1, 1>(q, 6.0f);
}

// 4-bit E2M1 -> f32, exact.
__device__ __forceinline__ float e2m1_to_f32(u32 c) {
    float mag = __fmul_rn(bits_f32((c & 0x7u) << 22), bits_f32((127u + 126u) << 23));
    return bits_f32(f32_bits(mag) | ((c & 0x8u) << 28));
}

// Scale a UE8M0 byte stands for: 2^(byte - 127); 255 is NaN.
__device__ __forceinline__ float ue8m0_to_f32(u32 b) {
    return b == 255u ? bits_f32(0x7fc00000u) : exp2_int((int)b - 127);
}

__device__ __forceinline__ u32 warp_max(u32 v) {
    for (int o = 16; o > 0; o >>= 1) {
        u32 w = __shfl_xor_sync(FULL_MASK, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// ---------------------------------------------------------------------------
// Write: c_kv [T, R] (row stride ckv_stride elements), k_pe [T, P] (row
// stride kpe_stride elements of type kpe_elem) -> cache at
// slot_mapping[t] * bpt. Negative slots and slots >= num_slots are skipped.
// bpt must be a multiple of 4.

// One warp per token (write and gather, latents and indexer keys alike):
// this warp's token, or -1 past the last one.
__device__ __forceinline__ i64 warp_token(i64 num_tokens) {
    i64 t = (i64)blockIdx.x * WARPS_PER_BLOCK + (threadIdx.x >> 5);
    return t < num_tokens ? t : -1;
}

// The slot a write stores token t in, or -1 when the token is skipped
// (negative slot, or slot >= num_slots).
__device__ __forceinline__ i64 write_slot(const i64* slots, i64 t, i64 num_slots) {
    i64 slot = slots[t];
    return slot < 0 || slot >= num_slots ? -1 : slot;
}

// Returns the token's destination, or null when the token is skipped.
__device__ __forceinline__ u8* write_dest(const i64* slots, i64 t, u8* cache, i64 num_slots, int bpt) {
    i64 slot = write_slot(slots, t, num_slots);
    return slot < 0 ? 0 : cache + slot * (i64)bpt;
}

// RoPE values of one token to bf16; their element type (0 bf16, 1 f16,
// 2 f32) is a kernel argument since it may differ from c_kv's.
__device__ __forceinline__ void write_rope(const void* kpe, i64 t, i64 kpe_stride, int kpe_elem, u8* dst,
                                           int P, int lane) {
    u16* out = (u16*)dst;
    if (kpe_elem == 0) {
        const u16* r = (const u16*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) out[i] = InBf16::to_bf16(r[i]);
    } else if (kpe_elem == 1) {
        const u16* r = (const u16*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) out[i] = InF16::to_bf16(r[i]);
    } else {
        const float* r = (const float*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) out[i] = InF32::to_bf16(r[i]);
    }
}

template <class In>
__device__ void write_bf16(const typename In::T* ckv, i64 ckv_stride, const void* kpe, i64 kpe_stride,
                           int kpe_elem, const i64* slots, i64 num_tokens, u8* cache,
                           i64 num_slots, int R, int P, int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    u8* dst = write_dest(slots, t, cache, num_slots, bpt);
    if (dst == 0) return;
    const typename In::T* x = ckv + t * ckv_stride;
    u16* out = (u16*)dst;
    for (int i = lane; i < R; i += 32) out[i] = In::to_bf16(x[i]);
    write_rope(kpe, t, kpe_stride, kpe_elem, dst + 2 * R, P, lane);
}

// fp8_ds_mla: tiles of 128 values; lane l owns values 4l..4l+3 of each tile
// and stores their four codes as one 32-bit word.
template <class In>
__device__ void write_fp8(const typename In::T* ckv, i64 ckv_stride, const void* kpe, i64 kpe_stride,
                          int kpe_elem, const i64* slots, i64 num_tokens, u8* cache,
                          i64 num_slots, int R, int P, int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    u8* dst = write_dest(slots, t, cache, num_slots, bpt);
    if (dst == 0) return;
    const typename In::T* x = ckv + t * ckv_stride;
    float* scales = (float*)(dst + R);
    for (int tile = 0; tile < R / 128; ++tile) {
        float v[4];
        u32 amax = 0u;
        for (int k = 0; k < 4; ++k) {
            v[k] = In::to_f32(x[tile * 128 + lane * 4 + k]);
            u32 m = finite_mag_bits(v[k]);
            amax = m > amax ? m : amax;
        }
        amax = warp_max(amax);
        // e = ceil(log2(max(amax / 448, 1e-4))), in -13..=120.
        int e = ceil_log2_pos(fmaxf(__fdiv_rn(bits_f32(amax), 448.0f), 1.0e-4f));
        // Multiplying by 2^-e (a normal float) equals dividing by 2^e.
        float inv = exp2_int(-e);
        u32 word = 0;
        for (int k = 0; k < 4; ++k) word |= f32_to_e4m3(__fmul_rn(v[k], inv)) << (8 * k);
        ((u32*)(dst + tile * 128))[lane] = word;
        if (lane == 0) scales[tile] = exp2_int(e);
    }
    write_rope(kpe, t, kpe_stride, kpe_elem, dst + R + 4 * (R / 128), P, lane);
}

// mxfp6: groups of 32 values, one value per lane; the 6-bit codes go through
// shared memory and are packed 16 codes (three 32-bit words) at a time.
template <class In>
__device__ void write_mxfp6(const typename In::T* ckv, i64 ckv_stride, const void* kpe, i64 kpe_stride,
                            int kpe_elem, const i64* slots, i64 num_tokens, u8* cache,
                            i64 num_slots, int R, int P, int bpt) {
    extern __shared__ u32 smem_codes[];  // R bytes per warp, as words
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    u8* dst = write_dest(slots, t, cache, num_slots, bpt);
    if (dst == 0) return;
    u8* codes = (u8*)smem_codes + warp * R;
    const typename In::T* x = ckv + t * ckv_stride;
    u8* scale_bytes = dst + 3 * R / 4;
    for (int g = 0; g < R / 32; ++g) {
        float v = In::to_f32(x[g * 32 + lane]);
        u32 amax = warp_max(finite_mag_bits(v));
        // e = ceil(log2(max(amax / 7.5, 2^-127))), in -127..=126.
        int e = ceil_log2_pos(fmaxf(__fdiv_rn(bits_f32(amax), 7.5f), bits_f32(0x00400000u)));
        codes[g * 32 + lane] = (u8)f32_to_e2m3(__fmul_rn(v, exp2_int(-e)));
        if (lane == 0) scale_bytes[g] = (u8)(e + 127);
    }
    __syncwarp();
    // Pack: unit u = codes 16u..16u+15 -> bytes 12u..12u+11.
    for (int u = lane; u < R / 16; u += 32) {
        const u32* c = (const u32*)(codes + 16 * u);
        u64 lo = 0, hi = 0;  // bits 0..63 and 64..95
        for (int w = 0; w < 4; ++w) {
            u32 cw = c[w];
            for (int b = 0; b < 4; ++b) {
                int i = 4 * w + b;  // element within the unit
                u64 code = (u64)((cw >> (8 * b)) & 0x3fu);
                int bit = 6 * i;
                if (bit < 64) {
                    lo |= code << bit;
                    if (bit + 6 > 64) hi |= code >> (64 - bit);
                } else {
                    hi |= code << (bit - 64);
                }
            }
        }
        u32* out = (u32*)(dst + 12 * u);
        out[0] = (u32)lo;
        out[1] = (u32)(lo >> 32);
        out[2] = (u32)hi;
    }
    write_rope(kpe, t, kpe_stride, kpe_elem, dst + 3 * R / 4 + R / 32, P, lane);
}

// nvfp4_ds_mla: byte of the scale section holding group g's scale, for S
// groups (a multiple of 4): a 4-row transpose, 8 * (g & 3) + (g >> 2) for
// S = 32.
__device__ __forceinline__ int scale_byte(int g, int S) { return S / 4 * (g % 4) + g / 4; }

// nvfp4_ds_mla: groups of 16 values, lane l owns groups l, l + 32, ...; its
// 8 code bytes are stored as two 32-bit words. The scale is
// e4m3(max(amax / 6, 2^-9)) with amax ignoring NaN; codes are
// e2m1(x * (1 / scale)).
template <class In>
__device__ void write_nvfp4(const typename In::T* ckv, i64 ckv_stride, const void* kpe, i64 kpe_stride,
                            int kpe_elem, const i64* slots, i64 num_tokens, u8* cache,
                            i64 num_slots, int R, int P, int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    u8* dst = write_dest(slots, t, cache, num_slots, bpt);
    if (dst == 0) return;
    const typename In::T* x = ckv + t * ckv_stride;
    u8* scales = dst + R / 2 + P;
    int S = R / 16;
    for (int g = lane; g < S; g += 32) {
        float v[16];
        float amax = 0.0f;
        for (int k = 0; k < 16; ++k) {
            v[k] = In::to_f32(x[g * 16 + k]);
            float a = fabsf(v[k]);
            amax = a > amax ? a : amax;  // NaN is ignored, Inf is kept
        }
        u32 scale = f32_to_e4m3(fmaxf(__fdiv_rn(amax, 6.0f), 0.001953125f));
        float inv = __fdiv_rn(1.0f, e4m3_to_f32(scale));
        u32 words[2] = {0u, 0u};
        for (int k = 0; k < 16; ++k) words[k / 8] |= f32_to_e2m1(__fmul_rn(v[k], inv)) << (4 * (k % 8));
        // 8 bytes at dst + 8g; bpt is a multiple of 4, so 32-bit stores.
        u32* out = (u32*)(dst + 8 * g);
        out[0] = words[0];
        out[1] = words[1];
        scales[scale_byte(g, S)] = (u8)scale;
    }
    u8* rope = dst + R / 2;
    if (kpe_elem == 0) {
        const u16* r = (const u16*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) rope[i] = (u8)f32_to_e4m3_satfinite(InBf16::to_f32(r[i]));
    } else if (kpe_elem == 1) {
        const u16* r = (const u16*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) rope[i] = (u8)f32_to_e4m3_satfinite(InF16::to_f32(r[i]));
    } else {
        const float* r = (const float*)kpe + t * kpe_stride;
        for (int i = lane; i < P; i += 32) rope[i] = (u8)f32_to_e4m3_satfinite(r[i]);
    }
}

#define WRITE_KERNEL(NAME, IMPL, IN)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)                          \
        NAME(const void* ckv, i64 ckv_stride, const void* kpe, i64 kpe_stride, int kpe_elem,    \
             const i64* slots, i64 num_tokens, u8* cache, i64 num_slots, int R, int P,          \
             int bpt) {                                                                         \
        IMPL<IN>((const IN::T*)ckv, ckv_stride, kpe, kpe_stride, kpe_elem, slots, num_tokens,   \
                 cache, num_slots, R, P, bpt);                                                  \
    }

WRITE_KERNEL(mla_write_bf16_from_bf16, write_bf16, InBf16)
WRITE_KERNEL(mla_write_bf16_from_f16, write_bf16, InF16)
WRITE_KERNEL(mla_write_bf16_from_f32, write_bf16, InF32)
WRITE_KERNEL(mla_write_fp8_ds_mla_from_bf16, write_fp8, InBf16)
WRITE_KERNEL(mla_write_fp8_ds_mla_from_f16, write_fp8, InF16)
WRITE_KERNEL(mla_write_fp8_ds_mla_from_f32, write_fp8, InF32)
WRITE_KERNEL(mla_write_mxfp6_from_bf16, write_mxfp6, InBf16)
WRITE_KERNEL(mla_write_mxfp6_from_f16, write_mxfp6, InF16)
WRITE_KERNEL(mla_write_mxfp6_from_f32, write_mxfp6, InF32)
WRITE_KERNEL(mla_write_nvfp4_ds_mla_from_bf16, write_nvfp4, InBf16)
WRITE_KERNEL(mla_write_nvfp4_ds_mla_from_f16, write_nvfp4, InF16)
WRITE_KERNEL(mla_write_nvfp4_ds_mla_from_f32, write_nvfp4, InF32)

// ---------------------------------------------------------------------------
// Gather: token i of the sequence lives in block block_table[i / block_size]
// at offset i % block_size; out [num_tokens, R + P] with row stride
// out_stride elements. Rows whose block id is >= num_blocks are zeroed.

struct OutBf16 {
    typedef u16 T;
    static __device__ __forceinline__ T from_f32(float v) { return f32_to_bf16(v); }
    static __device__ __forceinline__ T from_bf16(u16 v) { return v; }
};
struct OutF32 {
    typedef float T;
    static __device__ __forceinline__ T from_f32(float v) { return v; }
    static __device__ __forceinline__ T from_bf16(u16 v) { return bf16_to_f32(v); }
};

// The block holding token t of a gather's sequence (latents and indexer
// keys alike), or -1 when its id is >= num_blocks (the row is zeroed).
__device__ __forceinline__ i64 gather_block(const u32* block_table, i64 t, int block_size,
                                            i64 num_blocks) {
    u32 block = block_table[t / block_size];
    return (i64)block < num_blocks ? (i64)block : -1;
}

// Zeroes the n values of a row, lane-strided.
template <class T>
__device__ __forceinline__ void zero_row(T* y, int n, int lane) {
    for (int i = lane; i < n; i += 32) y[i] = (T)0;
}

// Returns the token's source, or null for an invalid block id (row zeroed).
template <class Out>
__device__ __forceinline__ const u8* gather_src(const u8* cache, const u32* block_table, i64 t,
                                                int block_size, i64 num_blocks, int bpt,
                                                typename Out::T* y, int E, int lane) {
    i64 block = gather_block(block_table, t, block_size, num_blocks);
    if (block < 0) {
        zero_row(y, E, lane);
        return 0;
    }
    i64 slot = block * block_size + t % block_size;
    return cache + slot * (i64)bpt;
}

template <class Out>
__device__ __forceinline__ void gather_rope(const u8* src, typename Out::T* y, int P, int lane) {
    const u16* r = (const u16*)src;
    for (int i = lane; i < P; i += 32) y[i] = Out::from_bf16(r[i]);
}

template <class Out>
__device__ void gather_bf16(const u8* cache, const u32* block_table, i64 num_tokens, int block_size,
                            i64 num_blocks, typename Out::T* out, i64 out_stride, int R, int P,
                            int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    typename Out::T* y = out + t * out_stride;
    const u8* src = gather_src<Out>(cache, block_table, t, block_size, num_blocks, bpt, y, R + P, lane);
    if (src == 0) return;
    const u16* s = (const u16*)src;
    for (int i = lane; i < R + P; i += 32) y[i] = Out::from_bf16(s[i]);
}

template <class Out>
__device__ void gather_fp8(const u8* cache, const u32* block_table, i64 num_tokens, int block_size,
                           i64 num_blocks, typename Out::T* out, i64 out_stride, int R, int P,
                           int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    typename Out::T* y = out + t * out_stride;
    const u8* src = gather_src<Out>(cache, block_table, t, block_size, num_blocks, bpt, y, R + P, lane);
    if (src == 0) return;
    const float* scales = (const float*)(src + R);
    for (int i = lane; i < R; i += 32) {
        u32 c = src[i];
        // A NaN code decodes to the NaN 0x7fc00000 whatever the scale.
        float v = (c & 0x7fu) == 0x7fu ? e4m3_to_f32(c) : __fmul_rn(e4m3_to_f32(c), scales[i / 128]);
        y[i] = Out::from_f32(v);
    }
    gather_rope<Out>(src + R + 4 * (R / 128), y + R, P, lane);
}

template <class Out>
__device__ void gather_mxfp6(const u8* cache, const u32* block_table, i64 num_tokens,
                             int block_size, i64 num_blocks, typename Out::T* out, i64 out_stride,
                             int R, int P, int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    typename Out::T* y = out + t * out_stride;
    const u8* src = gather_src<Out>(cache, block_table, t, block_size, num_blocks, bpt, y, R + P, lane);
    if (src == 0) return;
    const u8* scale_bytes = src + 3 * R / 4;
    for (int i = lane; i < R; i += 32) {
        int bit = 6 * i;
        u32 pair = (u32)src[bit >> 3];
        if ((bit & 7) > 2) pair |= (u32)src[(bit >> 3) + 1] << 8;
        u32 code = (pair >> (bit & 7)) & 0x3fu;
        u32 sb = scale_bytes[i / 32];
        // Scale byte 255 (NaN, never written) decodes to the NaN 0x7fc00000.
        float v = sb == 255u ? ue8m0_to_f32(sb) : __fmul_rn(e2m3_to_f32(code), ue8m0_to_f32(sb));
        y[i] = Out::from_f32(v);
    }
    gather_rope<Out>(src + 3 * R / 4 + R / 32, y + R, P, lane);
}

template <class Out>
__device__ void gather_nvfp4(const u8* cache, const u32* block_table, i64 num_tokens,
                             int block_size, i64 num_blocks, typename Out::T* out, i64 out_stride,
                             int R, int P, int bpt) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    typename Out::T* y = out + t * out_stride;
    const u8* src = gather_src<Out>(cache, block_table, t, block_size, num_blocks, bpt, y, R + P, lane);
    if (src == 0) return;
    const u8* rope = src + R / 2;
    const u8* scales = rope + P;
    for (int i = lane; i < R; i += 32) {
        u32 code = ((u32)src[i / 2] >> (4 * (i & 1))) & 0xfu;
        u32 sc = scales[scale_byte(i / 16, R / 16)];
        // A NaN scale code decodes to the NaN 0x7fc00000 whatever the code.
        float v = (sc & 0x7fu) == 0x7fu ? e4m3_to_f32(sc) : __fmul_rn(e2m1_to_f32(code), e4m3_to_f32(sc));
        y[i] = Out::from_f32(v);
    }
    for (int i = lane; i < P; i += 32) y[R + i] = Out::from_f32(e4m3_to_f32(rope[i]));
}

#define GATHER_KERNEL(NAME, IMPL, OUT)                                                          \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)                          \
        NAME(const u8* cache, const u32* block_table, i64 num_tokens, int block_size,           \
             i64 num_blocks, void* out, i64 out_stride, int R, int P, int bpt) {                \
        IMPL<OUT>(cache, block_table, num_tokens, block_size, num_blocks, (OUT::T*)out,         \
                  out_stride, R, P, bpt);                                                       \
    }

GATHER_KERNEL(mla_gather_bf16_to_bf16, gather_bf16, OutBf16)
GATHER_KERNEL(mla_gather_bf16_to_f32, gather_bf16, OutF32)
GATHER_KERNEL(mla_gather_fp8_ds_mla_to_bf16, gather_fp8, OutBf16)
GATHER_KERNEL(mla_gather_fp8_ds_mla_to_f32, gather_fp8, OutF32)
GATHER_KERNEL(mla_gather_mxfp6_to_bf16, gather_mxfp6, OutBf16)
GATHER_KERNEL(mla_gather_mxfp6_to_f32, gather_mxfp6, OutF32)
GATHER_KERNEL(mla_gather_nvfp4_ds_mla_to_bf16, gather_nvfp4, OutBf16)
GATHER_KERNEL(mla_gather_nvfp4_ds_mla_to_f32, gather_nvfp4, OutF32)

// ---------------------------------------------------------------------------
// copy_blocks: for every layer (blockIdx.y) and pair p < pairs.n (blockIdx.x),
// copy block pairs.ids[2p] to block pairs.ids[2p+1]. The pairs travel in the
// kernel parameters (no device scratch memory, nothing to synchronize).
// Layers lie layer_stride bytes apart. Pairs naming a block >= num_blocks are
// ignored. With vec16 (block_bytes a multiple of 16, base 16-byte aligned)
// the copy moves 16-byte words.

struct CopyPairs {
    u32 n;
    u32 ids[2 * COPY_PAIRS_PER_LAUNCH];
};

extern "C" __global__ void __launch_bounds__(256)
    mla_copy_blocks(u8* base, i64 layer_stride, i64 block_bytes, i64 num_blocks,
                    CopyPairs pairs, int vec16) {
    if (blockIdx.x >= pairs.n) return;
    u32 src_block = pairs.ids[2 * blockIdx.x];
    u32 dst_block = pairs.ids[2 * blockIdx.x + 1];
    if ((i64)src_block >= num_blocks || (i64)dst_block >= num_blocks) return;
    u8* layer = base + (i64)blockIdx.y * layer_stride;
    const u8* src = layer + (i64)src_block * block_bytes;
    u8* dst = layer + (i64)dst_block * block_bytes;
    if (vec16) {
        const uint4* s = (const uint4*)src;
        uint4* d = (uint4*)dst;
        for (i64 i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) d[i] = s[i];
    } else {
        for (i64 i = threadIdx.x; i < block_bytes; i += blockDim.x) dst[i] = src[i];
    }
}

// ---------------------------------------------------------------------------
// Indexer keys (DeepSeek-V3.2): per layer [num_blocks][block_size * (H + 4)]
// bytes; within a block the H e4m3fn codes of every token come first (token
// after token), then every token's fp32 scale. H is a multiple of 4. One warp
// per token; lane l owns the 4-code words l, l + 32, ... of its key.

// Start of the block holding `slot`, and the token's offset in it.
__device__ __forceinline__ u8* indexer_block(u8* cache, i64 slot, int block_size, int H) {
    return cache + (slot / block_size) * (i64)block_size * (i64)(H + 4);
}

// keys [T, H] (row stride keys_stride elements) -> the indexer part of a
// layer. Scale 2^e with e = ceil(log2(max(amax, 1e-4) / 448)), in -22..=120.
// Negative slots and slots >= num_slots are skipped.
template <class In>
__device__ void indexer_write(const typename In::T* keys, i64 keys_stride, const i64* slots,
                              i64 num_tokens, u8* cache, i64 num_slots, int block_size, int H) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    i64 slot = write_slot(slots, t, num_slots);
    if (slot < 0) return;
    const typename In::T* x = keys + t * keys_stride;
    u32 amax = 0u;
    for (int w = lane; w < H / 4; w += 32) {
        for (int k = 0; k < 4; ++k) {
            u32 m = finite_mag_bits(In::to_f32(x[4 * w + k]));
            amax = m > amax ? m : amax;
        }
    }
    amax = warp_max(amax);
    int e = ceil_log2_pos(__fdiv_rn(fmaxf(bits_f32(amax), 1.0e-4f), 448.0f));
    float inv = exp2_int(-e);
    u8* block = indexer_block(cache, slot, block_size, H);
    int offset = (int)(slot % block_size);
    u32* codes = (u32*)(block + (i64)offset * H);
    for (int w = lane; w < H / 4; w += 32) {
        u32 word = 0;
        for (int k = 0; k < 4; ++k) word |= f32_to_e4m3(__fmul_rn(In::to_f32(x[4 * w + k]), inv)) << (8 * k);
        codes[w] = word;
    }
    if (lane == 0) ((float*)(block + (i64)block_size * H))[offset] = exp2_int(e);
}

#define INDEXER_WRITE_KERNEL(NAME, IN)                                                          \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)                          \
        NAME(const void* keys, i64 keys_stride, const i64* slots, i64 num_tokens, u8* cache,    \
             i64 num_slots, int block_size, int H) {                                            \
        indexer_write<IN>((const IN::T*)keys, keys_stride, slots, num_tokens, cache, num_slots, \
                          block_size, H);                                                       \
    }

INDEXER_WRITE_KERNEL(mla_indexer_write_from_bf16, InBf16)
INDEXER_WRITE_KERNEL(mla_indexer_write_from_f16, InF16)
INDEXER_WRITE_KERNEL(mla_indexer_write_from_f32, InF32)

// The indexer part of token t of a sequence through a block table, or null
// for an invalid block id.
__device__ __forceinline__ const u8* indexer_src(const u8* cache, const u32* block_table, i64 t,
                                                 int block_size, i64 num_blocks, int H) {
    i64 block = gather_block(block_table, t, block_size, num_blocks);
    return block < 0 ? 0 : cache + block * block_size * (H + 4);
}

// Dequantizes keys into out [T, H] (row stride out_stride elements); rows
// whose block id is >= num_blocks are zeroed.
template <class Out>
__device__ void indexer_gather(const u8* cache, const u32* block_table, i64 num_tokens,
                               int block_size, i64 num_blocks, typename Out::T* out,
                               i64 out_stride, int H) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    typename Out::T* y = out + t * out_stride;
    const u8* block = indexer_src(cache, block_table, t, block_size, num_blocks, H);
    if (block == 0) {
        zero_row(y, H, lane);
        return;
    }
    int offset = (int)(t % block_size);
    const u8* codes = block + (i64)offset * H;
    float scale = ((const float*)(block + (i64)block_size * H))[offset];
    for (int i = lane; i < H; i += 32) {
        u32 c = codes[i];
        // A NaN code decodes to the NaN 0x7fc00000 whatever the scale.
        float v = (c & 0x7fu) == 0x7fu ? e4m3_to_f32(c) : __fmul_rn(e4m3_to_f32(c), scale);
        y[i] = Out::from_f32(v);
    }
}

#define INDEXER_GATHER_KERNEL(NAME, OUT)                                                        \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)                          \
        NAME(const u8* cache, const u32* block_table, i64 num_tokens, int block_size,           \
             i64 num_blocks, void* out, i64 out_stride, int H) {                                \
        indexer_gather<OUT>(cache, block_table, num_tokens, block_size, num_blocks,             \
                            (OUT::T*)out, out_stride, H);                                       \
    }

INDEXER_GATHER_KERNEL(mla_indexer_gather_to_bf16, OutBf16)
INDEXER_GATHER_KERNEL(mla_indexer_gather_to_f32, OutF32)

// Copies stored keys without dequantizing: token t's codes to codes[t * H..]
// and its scale to scales[t]; zeros for an invalid block id.
extern "C" __global__ void __launch_bounds__(32 * WARPS_PER_BLOCK)
    mla_indexer_gather_quantized(const u8* cache, const u32* block_table, i64 num_tokens,
                                 int block_size, i64 num_blocks, u8* codes, float* scales, int H) {
    int lane = threadIdx.x & 31;
    i64 t = warp_token(num_tokens);
    if (t < 0) return;
    u8* y = codes + t * H;
    const u8* block = indexer_src(cache, block_table, t, block_size, num_blocks, H);
    if (block == 0) {
        zero_row(y, H, lane);
        if (lane == 0) scales[t] = 0.0f;
        return;
    }
    int offset = (int)(t % block_size);
    const u8* src = block + (i64)offset * H;
    for (int i = lane; i < H; i += 32) y[i] = src[i];
    if (lane == 0) scales[t] = ((const float*)(block + (i64)block_size * H))[offset];
}
