// Causal softmax attention, forward and backward, one (batch, head) pair at a time: XLA FFI custom calls for
// training on CPU.
//
// XLA:CPU computes attention as separate batched products and elementwise passes over each block of scores,
// each going through memory. Here a pair's keys and values (transposed to K x T, so that a pass over keys is
// contiguous) stay in L1/L2 while every query row computes its scores, softmax and output in one go; the
// backward recomputes each row's softmax from the saved log-sum-exp (as flash attention does) and accumulates
// the key and value gradients in place. Pairs are taken in turn by the calling thread and XLA's intra-op pool.
// Inputs are B x T x H x K float32, queries already scaled; built and loaded by tapernorm_jax/cpu_kernels/attention.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int64_t kLanes = 16;
typedef float Vec __attribute__((vector_size(4 * kLanes), aligned(4), may_alias));
typedef int32_t IVec __attribute__((vector_size(4 * kLanes), aligned(4), may_alias));

constexpr IVec kLaneIndex = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

inline Vec Load(const float* p) { return *reinterpret_cast<const Vec*>(p); }
inline void Store(float* p, Vec x) { *reinterpret_cast<Vec*>(p) = x; }
inline Vec Splat(float x) { return Vec{} + x; }
inline float Sum(Vec v) {
  float s = 0.f;
  for (int i = 0; i < kLanes; ++i) s += v[i];
  return s;
}

// exp(x) for x <= 0 to about 2 ulp: x = n ln2 + r, |r| <= ln2 / 2, exp(r) by Cephes' degree-6 polynomial and 2^n
// through the exponent bits; below -87 it returns ~1e-38.
inline Vec Exp(Vec x) {
  x = x < -87.0f ? Splat(-87.0f) : x;
  const Vec t = x * 1.44269504088896341f + 0.5f;
  Vec n = __builtin_convertvector(__builtin_convertvector(t, IVec), Vec);  // truncated toward 0
  n = n > t ? n - 1.0f : n;                                               // floor
  const Vec r = x - n * 0.693359375f + n * 2.12194440e-4f;
  Vec p = Splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const IVec bits = (__builtin_convertvector(n, IVec) + 127) << 23;
  return p * reinterpret_cast<const Vec&>(bits);
}

struct Shape {
  int64_t B, T, H, K;
  int64_t Row(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * K; }
  int64_t Padded() const { return (T + kLanes - 1) / kLanes * kLanes; }  // rows of the K x T copies
};

// x (one pair's T rows of K, strided by H * K) as K x P, zero past T.
void Transpose(const float* x, const Shape& s, int64_t b, int64_t h, float* xT) {
  const int64_t P = s.Padded();
  for (int64_t k = 0; k < s.K; ++k)
    for (int64_t t = s.T; t < P; ++t) xT[k * P + t] = 0.f;
  for (int64_t t = 0; t < s.T; ++t) {
    const float* row = x + s.Row(b, t, h);
    for (int64_t k = 0; k < s.K; ++k) xT[k * P + t] = row[k];
  }
}

constexpr int kRows = 4;  // query rows handled together: each key and value chunk loaded is used kRows times

// out[r][j] = a[r] . x[j] for kRows rows a (K apart) and the chunks of keys that cover j < n (x as K x P; out rows
// P apart).
inline void Dots(const float* a, const float* xT, int64_t K, int64_t P, int64_t n, float* out) {
  for (int64_t j = 0; j < n; j += kLanes) {
    Vec acc[kRows] = {};
    for (int64_t k = 0; k < K; ++k) {
      const Vec x = Load(xT + k * P + j);
      for (int r = 0; r < kRows; ++r) acc[r] += a[r * K + k] * x;
    }
    for (int r = 0; r < kRows; ++r) Store(out + r * P + j, acc[r]);
  }
}

// out[r][k] = scale[r] * sum_j w[r][j] x[j][k] over the chunks that cover j < n (w rows P apart, zero past their
// own length; out rows `stride` apart).
inline void WeightedSums(const float* w, const float* xT, int64_t K, int64_t P, int64_t n, const float* scale,
                         float* out, int64_t stride, int rows) {
  for (int64_t k = 0; k < K; ++k) {
    Vec acc[kRows] = {};
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec x = Load(xT + k * P + j);
      for (int r = 0; r < kRows; ++r) acc[r] += Load(w + r * P + j) * x;
    }
    for (int r = 0; r < rows; ++r) out[r * stride + k] = Sum(acc[r]) * scale[r];
  }
}

// kRows rows of x from row i on (one pair's, K features each) into buf, zero past the last row T - 1.
inline void Gather(const float* x, const Shape& s, int64_t b, int64_t i, int64_t h, float* buf) {
  for (int r = 0; r < kRows; ++r)
    for (int64_t k = 0; k < s.K; ++k) buf[r * s.K + k] = i + r < s.T ? x[s.Row(b, i + r, h) + k] : 0.f;
}

inline Vec Visible(int64_t j, int64_t n, Vec x) {  // x where key j + lane < n, else 0
  return (kLaneIndex + static_cast<int32_t>(j)) < static_cast<int32_t>(n) ? x : Vec{};
}

struct Forward {
  const float *q, *k, *v;
  float *out, *lse;
  Shape s;

  void Pair(int64_t pair, std::vector<float>& scratch) const {
    const int64_t b = pair / s.H, h = pair % s.H, T = s.T, K = s.K, P = s.Padded();
    scratch.resize(2 * K * P + kRows * P + kRows * K);
    float *kT = scratch.data(), *vT = kT + K * P, *w = vT + K * P, *qs = w + kRows * P;
    Transpose(k, s, b, h, kT);
    Transpose(v, s, b, h, vT);
    for (int64_t i = 0; i < T; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, T - i));
      const int64_t n = i + rows;  // keys the last of these rows sees
      Gather(q, s, b, i, h, qs);
      Dots(qs, kT, K, P, n, w);
      float scale[kRows];
      for (int r = 0; r < kRows; ++r) {
        float* wr = w + r * P;
        const int64_t nr = std::min(i + r + 1, n);
        Vec highest = Splat(-3.0e38f);
        for (int64_t j = 0; j < n; j += kLanes) {
          const Vec x = (kLaneIndex + static_cast<int32_t>(j)) < static_cast<int32_t>(nr) ? Load(wr + j) : highest;
          highest = x > highest ? x : highest;
        }
        float m = highest[0];
        for (int l = 1; l < kLanes; ++l) m = std::max(m, highest[l]);
        Vec total{};
        for (int64_t j = 0; j < n; j += kLanes) {
          const Vec e = Visible(j, nr, Exp(Load(wr + j) - m));
          Store(wr + j, e);
          total += e;
        }
        const float sum = Sum(total);
        scale[r] = 1.f / sum;
        if (r < rows) lse[pair * T + i + r] = m + std::log(sum);
      }
      WeightedSums(w, vT, K, P, n, scale, out + s.Row(b, i, h), s.H * K, rows);
    }
  }
};

struct Backward {
  const float *q, *k, *v, *out, *lse, *dout;
  float *dq, *dk, *dv;
  Shape s;

  void Pair(int64_t pair, std::vector<float>& scratch) const {
    const int64_t b = pair / s.H, h = pair % s.H, T = s.T, K = s.K, P = s.Padded();
    scratch.assign(4 * K * P + 2 * kRows * P + 2 * kRows * K, 0.f);
    float *kT = scratch.data(), *vT = kT + K * P, *dkT = vT + K * P, *dvT = dkT + K * P;
    float *p = dvT + K * P, *ds = p + kRows * P, *qs = ds + kRows * P, *dos = qs + kRows * K;
    Transpose(k, s, b, h, kT);
    Transpose(v, s, b, h, vT);
    const float ones[kRows] = {1.f, 1.f, 1.f, 1.f};
    for (int64_t i = 0; i < T; i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, T - i));
      const int64_t n = i + rows;
      Gather(q, s, b, i, h, qs);
      Gather(dout, s, b, i, h, dos);
      Dots(qs, kT, K, P, n, p);
      Dots(dos, vT, K, P, n, ds);  // dp
      for (int r = 0; r < kRows; ++r) {
        const int64_t nr = std::min(i + r + 1, n);
        float delta = 0.f, l = 0.f;
        if (r < rows) {
          const float* oi = out + s.Row(b, i + r, h);
          for (int64_t c = 0; c < K; ++c) delta += dos[r * K + c] * oi[c];
          l = lse[pair * T + i + r];
        }
        float *pr = p + r * P, *dsr = ds + r * P;
        for (int64_t j = 0; j < n; j += kLanes) {
          const Vec e = Visible(j, r < rows ? nr : 0, Exp(Load(pr + j) - l));
          Store(pr + j, e);
          Store(dsr + j, e * (Load(dsr + j) - delta));
        }
      }
      WeightedSums(ds, kT, K, P, n, ones, dq + s.Row(b, i, h), s.H * K, rows);
      for (int64_t c = 0; c < K; ++c) {
        float *dkc = dkT + c * P, *dvc = dvT + c * P;
        for (int64_t j = 0; j < n; j += kLanes) {
          Vec dkj = Load(dkc + j), dvj = Load(dvc + j);
          for (int r = 0; r < kRows; ++r) {
            dkj += Load(ds + r * P + j) * qs[r * K + c];
            dvj += Load(p + r * P + j) * dos[r * K + c];
          }
          Store(dkc + j, dkj);
          Store(dvc + j, dvj);
        }
      }
    }
    for (int64_t t = 0; t < T; ++t) {
      float *dkt = dk + s.Row(b, t, h), *dvt = dv + s.Row(b, t, h);
      for (int64_t c = 0; c < K; ++c) {
        dkt[c] = dkT[c * P + t];
        dvt[c] = dvT[c * P + t];
      }
    }
  }
};

// Pairs taken in turn by whichever thread is free; shared with pool tasks that may start late.
template <typename Job>
struct Work {
  Job job;
  int64_t pairs;
  std::atomic<int64_t> next{0}, done{0};

  void Run() {
    std::vector<float> scratch;
    for (int64_t p; (p = next.fetch_add(1)) < pairs;) {
      job.Pair(p, scratch);
      done.fetch_add(1);
    }
  }
};

template <typename Job>
void RunPairs(ffi::ThreadPool& pool, const Job& job, int64_t pairs) {
  auto work = std::make_shared<Work<Job>>();
  work->job = job;
  work->pairs = pairs;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  for (int64_t t = 1; t < std::min(threads, pairs); ++t) pool.Schedule([work] { work->Run(); });
  work->Run();
  while (work->done.load() < pairs) std::this_thread::yield();  // pairs others took are running
}

using B4 = ffi::Buffer<ffi::F32, 4>;
using B3 = ffi::Buffer<ffi::F32, 3>;

Shape ShapeOf(const B4& x) {
  auto d = x.dimensions();
  return {d[0], d[1], d[2], d[3]};
}

ffi::Error ForwardImpl(ffi::ThreadPool pool, B4 q, B4 k, B4 v, ffi::ResultBuffer<ffi::F32, 4> out,
                       ffi::ResultBuffer<ffi::F32, 3> lse) {
  const Shape s = ShapeOf(q);
  RunPairs(pool, Forward{q.typed_data(), k.typed_data(), v.typed_data(), out->typed_data(), lse->typed_data(), s},
           s.B * s.H);
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, B4 q, B4 k, B4 v, B4 out, B3 lse, B4 dout,
                        ffi::ResultBuffer<ffi::F32, 4> dq, ffi::ResultBuffer<ffi::F32, 4> dk,
                        ffi::ResultBuffer<ffi::F32, 4> dv) {
  const Shape s = ShapeOf(q);
  RunPairs(pool, Backward{q.typed_data(), k.typed_data(), v.typed_data(), out.typed_data(), lse.typed_data(),
                          dout.typed_data(), dq->typed_data(), dk->typed_data(), dv->typed_data(), s},
           s.B * s.H);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionForward, ForwardImpl,
                              ffi::Ffi::Bind().Ctx<ffi::ThreadPool>().Arg<B4>().Arg<B4>().Arg<B4>().Ret<B4>().Ret<B3>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(AttentionBackward, BackwardImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<B4>()
                                  .Arg<B4>()
                                  .Arg<B4>()
                                  .Arg<B4>()
                                  .Arg<B3>()
                                  .Arg<B4>()
                                  .Ret<B4>()
                                  .Ret<B4>()
                                  .Ret<B4>());
