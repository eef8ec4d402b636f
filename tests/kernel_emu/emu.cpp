// Runs the CUDA kernels of src/store/kernels.cu on the CPU: every CUDA
// thread is a std::thread, a warp's shuffles and __syncwarp meet at a
// barrier of its 32 threads, thread blocks run one after another (warps
// of a block that exit early are fine: a warp's lanes exit together). Only the
// features the kernels use are emulated. Float arithmetic is IEEE binary32
// with round to nearest even and no flush to zero, as on the GPU with
// --ftz=false --prec-div=true --fmad=false (build with -ffp-contract=off).
//
// Entry point: emu_launch(name, grid_x, grid_y, block_x, shared_bytes,
// params), with params laid out as for cuLaunchKernel.

#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

struct Dim3 {
    unsigned x, y, z;
};
struct uint4 {
    unsigned x, y, z, w;
};

static thread_local Dim3 threadIdx;
static thread_local Dim3 blockIdx;
static Dim3 blockDim;

struct Warp {
    std::barrier<> sync{32};
    unsigned exchange[32];
};
static thread_local Warp* this_warp;

// Dynamic shared memory of the running block: one block at a time, one
// launch at a time (callers may be concurrent, see launch_lock).
alignas(16) unsigned int smem_codes[1 << 16];

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__

static inline unsigned __float_as_uint(float f) {
    unsigned u;
    std::memcpy(&u, &f, 4);
    return u;
}
static inline float __uint_as_float(unsigned u) {
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}
static inline int __clz(unsigned x) { return x == 0 ? 32 : __builtin_clz(x); }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline void __syncwarp() { this_warp->sync.arrive_and_wait(); }
static inline unsigned __shfl_xor_sync(unsigned, unsigned v, int lane_mask) {
    unsigned lane = threadIdx.x & 31;
    this_warp->exchange[lane] = v;
    this_warp->sync.arrive_and_wait();
    unsigned r = this_warp->exchange[lane ^ (unsigned)lane_mask];
    this_warp->sync.arrive_and_wait();
    return r;
}

#include "../../src/store/cuda/kernels.cu"

typedef long long i64;

// One std::thread per CUDA thread of a block; the threads walk the grid's
// blocks together, meeting at a block barrier between blocks.
template <class F>
static void run_grid(unsigned gx, unsigned gy, unsigned bx, F kernel) {
    blockDim = Dim3{bx, 1, 1};
    std::vector<Warp> warps((bx + 31) / 32);
    std::barrier<> block_done((std::ptrdiff_t)bx);
    std::vector<std::thread> threads;
    threads.reserve(bx);
    for (unsigned t = 0; t < bx; ++t) {
        threads.emplace_back([&, t] {
            threadIdx = Dim3{t, 0, 0};
            this_warp = &warps[t / 32];
            for (unsigned by = 0; by < gy; ++by) {
                for (unsigned b = 0; b < gx; ++b) {
                    blockIdx = Dim3{b, by, 0};
                    kernel();
                    block_done.arrive_and_wait();
                }
            }
        });
    }
    for (auto& th : threads) th.join();
}

template <class T>
static T P(void** params, int i) {
    return *(T*)params[i];
}

typedef void (*WriteFn)(const void*, i64, const void*, i64, int, const i64*, i64, u8*, i64, int, int, int);
typedef void (*GatherFn)(const u8*, const u32*, i64, int, i64, void*, i64, int, int, int);

struct Named {
    const char* name;
    WriteFn write;
    GatherFn gather;
};

static const Named KERNELS[] = {
    {"mla_write_bf16_from_bf16", mla_write_bf16_from_bf16, nullptr},
    {"mla_write_bf16_from_f16", mla_write_bf16_from_f16, nullptr},
    {"mla_write_bf16_from_f32", mla_write_bf16_from_f32, nullptr},
    {"mla_write_fp8_ds_mla_from_bf16", mla_write_fp8_ds_mla_from_bf16, nullptr},
    {"mla_write_fp8_ds_mla_from_f16", mla_write_fp8_ds_mla_from_f16, nullptr},
    {"mla_write_fp8_ds_mla_from_f32", mla_write_fp8_ds_mla_from_f32, nullptr},
    {"mla_write_mxfp6_from_bf16", mla_write_mxfp6_from_bf16, nullptr},
    {"mla_write_mxfp6_from_f16", mla_write_mxfp6_from_f16, nullptr},
    {"mla_write_mxfp6_from_f32", mla_write_mxfp6_from_f32, nullptr},
    {"mla_write_nvfp4_ds_mla_from_bf16", mla_write_nvfp4_ds_mla_from_bf16, nullptr},
    {"mla_write_nvfp4_ds_mla_from_f16", mla_write_nvfp4_ds_mla_from_f16, nullptr},
    {"mla_write_nvfp4_ds_mla_from_f32", mla_write_nvfp4_ds_mla_from_f32, nullptr},
    {"mla_gather_bf16_to_bf16", nullptr, mla_gather_bf16_to_bf16},
    {"mla_gather_bf16_to_f32", nullptr, mla_gather_bf16_to_f32},
    {"mla_gather_fp8_ds_mla_to_bf16", nullptr, mla_gather_fp8_ds_mla_to_bf16},
    {"mla_gather_fp8_ds_mla_to_f32", nullptr, mla_gather_fp8_ds_mla_to_f32},
    {"mla_gather_mxfp6_to_bf16", nullptr, mla_gather_mxfp6_to_bf16},
    {"mla_gather_mxfp6_to_f32", nullptr, mla_gather_mxfp6_to_f32},
    {"mla_gather_nvfp4_ds_mla_to_bf16", nullptr, mla_gather_nvfp4_ds_mla_to_bf16},
    {"mla_gather_nvfp4_ds_mla_to_f32", nullptr, mla_gather_nvfp4_ds_mla_to_f32},
};

typedef void (*IndexerWriteFn)(const void*, i64, const i64*, i64, u8*, i64, int, int);
typedef void (*IndexerGatherFn)(const u8*, const u32*, i64, int, i64, void*, i64, int);

// The indexer-key kernels (names starting with mla_indexer_); 1 for an
// unknown name.
static int indexer_launch(const std::string& n, unsigned gx, unsigned gy, unsigned bx, void** p) {
    static const std::pair<const char*, IndexerWriteFn> writes[] = {
        {"mla_indexer_write_from_bf16", mla_indexer_write_from_bf16},
        {"mla_indexer_write_from_f16", mla_indexer_write_from_f16},
        {"mla_indexer_write_from_f32", mla_indexer_write_from_f32},
    };
    static const std::pair<const char*, IndexerGatherFn> gathers[] = {
        {"mla_indexer_gather_to_bf16", mla_indexer_gather_to_bf16},
        {"mla_indexer_gather_to_f32", mla_indexer_gather_to_f32},
    };
    for (const auto& [name, f] : writes) {
        if (n != name) continue;
        run_grid(gx, gy, bx, [&] {
            f(P<const void*>(p, 0), P<i64>(p, 1), P<const i64*>(p, 2), P<i64>(p, 3), P<u8*>(p, 4), P<i64>(p, 5),
              P<int>(p, 6), P<int>(p, 7));
        });
        return 0;
    }
    for (const auto& [name, f] : gathers) {
        if (n != name) continue;
        run_grid(gx, gy, bx, [&] {
            f(P<const u8*>(p, 0), P<const u32*>(p, 1), P<i64>(p, 2), P<int>(p, 3), P<i64>(p, 4), P<void*>(p, 5),
              P<i64>(p, 6), P<int>(p, 7));
        });
        return 0;
    }
    if (n == "mla_indexer_gather_quantized") {
        run_grid(gx, gy, bx, [&] {
            mla_indexer_gather_quantized(P<const u8*>(p, 0), P<const u32*>(p, 1), P<i64>(p, 2), P<int>(p, 3),
                                         P<i64>(p, 4), P<u8*>(p, 5), P<float*>(p, 6), P<int>(p, 7));
        });
        return 0;
    }
    return 1;
}

// Returns 0 on success, 1 for an unknown kernel name, 2 when the shared
// memory does not fit.
extern "C" int emu_launch(const char* name, unsigned gx, unsigned gy, unsigned bx, unsigned shared_bytes,
                          void** p) {
    if (shared_bytes > sizeof(smem_codes)) return 2;
    static std::mutex launch_lock;
    std::lock_guard<std::mutex> serial(launch_lock);
    std::string n(name);
    if (n == "mla_copy_blocks") {
        run_grid(gx, gy, bx, [&] {
            mla_copy_blocks(P<u8*>(p, 0), P<i64>(p, 1), P<i64>(p, 2), P<i64>(p, 3), P<CopyPairs>(p, 4),
                            P<int>(p, 5));
        });
        return 0;
    }
    if (n.rfind("mla_indexer_", 0) == 0) return indexer_launch(n, gx, gy, bx, p);
    for (const Named& k : KERNELS) {
        if (n != k.name) continue;
        if (k.write) {
            run_grid(gx, gy, bx, [&] {
                k.write(P<const void*>(p, 0), P<i64>(p, 1), P<const void*>(p, 2), P<i64>(p, 3), P<int>(p, 4),
                        P<const i64*>(p, 5), P<i64>(p, 6), P<u8*>(p, 7), P<i64>(p, 8), P<int>(p, 9),
                        P<int>(p, 10), P<int>(p, 11));
            });
        } else {
            run_grid(gx, gy, bx, [&] {
                k.gather(P<const u8*>(p, 0), P<const u32*>(p, 1), P<i64>(p, 2), P<int>(p, 3), P<i64>(p, 4),
                         P<void*>(p, 5), P<i64>(p, 6), P<int>(p, 7), P<int>(p, 8), P<int>(p, 9));
            });
        }
        return 0;
    }
    return 1;
}
