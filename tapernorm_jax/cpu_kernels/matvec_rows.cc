// out[r, o] = sum_k x[r, k] * w[o, k] for 1 to 8 rows r: an XLA FFI custom call for batched decode on CPU.
//
// XLA:CPU hands a product of 2-8 rows with a weight to a GEMM that first packs the weight, or (one row at a
// time) reads the weight once per row. Here every weight row (output o, input axis minor) is read once,
// from DRAM, and dotted with all rows of x, which stay in L1. Output rows are split into chunks that the
// calling thread and XLA's intra-op pool take in turn. Built and loaded by tapernorm_jax/matvec.py.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kMaxRows = 8;
// Unaligned, aliasing loads of 8 floats: AVX on x86, two NEON registers on ARM.
typedef float Vec8 __attribute__((vector_size(32), aligned(4), may_alias));

float Sum(Vec8 v) {
  float s = 0.f;
  for (int i = 0; i < 8; ++i) s += v[i];
  return s;
}

// Output columns [o0, o1) for R rows.
template <int R>
void Dots(const float* __restrict x, const float* __restrict w, float* __restrict out, int64_t K, int64_t O,
          int64_t o0, int64_t o1) {
  const int64_t K8 = K / 8 * 8;
  for (int64_t o = o0; o < o1; ++o) {
    const float* w_row = w + o * K;
    Vec8 acc[R] = {};
    for (int64_t k = 0; k < K8; k += 8) {
      const Vec8 w_k = *reinterpret_cast<const Vec8*>(w_row + k);
      __builtin_prefetch(w_row + K + k);  // the next weight row, while this one is summed
      for (int r = 0; r < R; ++r) acc[r] += *reinterpret_cast<const Vec8*>(x + r * K + k) * w_k;
    }
    for (int r = 0; r < R; ++r) {
      float s = Sum(acc[r]);
      for (int64_t k = K8; k < K; ++k) s += x[r * K + k] * w_row[k];
      out[r * O + o] = s;
    }
  }
}

using DotsFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
constexpr DotsFn kDots[kMaxRows] = {Dots<1>, Dots<2>, Dots<3>, Dots<4>, Dots<5>, Dots<6>, Dots<7>, Dots<8>};

// Chunks of output columns, taken in turn by whichever thread is free; shared with tasks that may start late.
struct Work {
  const float* x;
  const float* w;
  float* out;
  int64_t K, O, chunk, chunks;
  DotsFn dots;
  std::atomic<int64_t> next{0}, done{0};

  void Run() {
    for (int64_t c; (c = next.fetch_add(1)) < chunks;) {
      dots(x, w, out, K, O, c * chunk, std::min(O, (c + 1) * chunk));
      done.fetch_add(1);
    }
  }
};

using Matrix = ffi::Buffer<ffi::F32, 2>;

ffi::Error MatvecRowsImpl(ffi::ThreadPool pool, Matrix x, Matrix w, ffi::ResultBuffer<ffi::F32, 2> out) {
  const int64_t R = x.dimensions()[0], K = x.dimensions()[1], O = w.dimensions()[0];
  if (R < 1 || R > kMaxRows) return ffi::Error::InvalidArgument("matvec_rows: x must have 1 to 8 rows");
  if (w.dimensions()[1] != K) return ffi::Error::InvalidArgument("matvec_rows: x and w differ in input width");
  auto work = std::make_shared<Work>();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  work->x = x.typed_data();
  work->w = w.typed_data();
  work->out = out->typed_data();
  work->K = K;
  work->O = O;
  work->dots = kDots[R - 1];
  work->chunk = std::max<int64_t>(16, (O + 4 * threads - 1) / (4 * threads));  // ~4 chunks a thread
  work->chunks = (O + work->chunk - 1) / work->chunk;
  for (int64_t t = 1; t < std::min(threads, work->chunks); ++t) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load() < work->chunks) std::this_thread::yield();  // chunks others took are running
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(MatvecRows, MatvecRowsImpl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<Matrix>().Arg<Matrix>().Ret<Matrix>());
