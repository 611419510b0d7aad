// Causal softmax attention, forward and backward, one (batch, head) pair at a time: XLA FFI custom calls for
// training on CPU.
//
// XLA:CPU computes attention as separate batched products and elementwise passes over each block of scores,
// each going through memory. Here a pair's keys and values (keys transposed to K x T, so that a pass over keys is
// contiguous) stay in L1/L2 while a few query rows at a time compute their scores, softmax and output in one go;
// the backward recomputes each row's softmax from the saved log-sum-exp (as flash attention does) and accumulates
// the key and value gradients in place. Heads of 16, 32, 48 or 64 features take the wide form (`Wide`: sums over
// keys run along the features, 8 or 4 query rows at a time), others the narrow one (sums along the keys, 4 rows).
// Pairs are taken in turn by the calling thread and XLA's intra-op pool. Inputs are B x T x H x K float32, queries
// already scaled; built and loaded by tapernorm_jax/cpu_kernels/attention.py.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
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

// out[r][j] = a[r] . x[j] for R rows a (K apart) and the chunks of keys that cover j < n (x as K x P; out rows
// P apart).
template <int R>
inline void Dots(const float* a, const float* xT, int64_t K, int64_t P, int64_t n, float* out) {
  for (int64_t j = 0; j < n; j += kLanes) {
    Vec acc[R] = {};
    for (int64_t k = 0; k < K; ++k) {
      const Vec x = Load(xT + k * P + j);
      for (int r = 0; r < R; ++r) acc[r] += a[r * K + k] * x;
    }
    for (int r = 0; r < R; ++r) Store(out + r * P + j, acc[r]);
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

// R rows of x from row i on (one pair's, K features each) into buf, zero past the last row T - 1.
template <int R>
inline void Gather(const float* x, const Shape& s, int64_t b, int64_t i, int64_t h, float* buf) {
  for (int r = 0; r < R; ++r)
    for (int64_t k = 0; k < s.K; ++k) buf[r * s.K + k] = i + r < s.T ? x[s.Row(b, i + r, h) + k] : 0.f;
}

inline Vec Visible(int64_t j, int64_t n, Vec x) {  // x where key j + lane < n, else 0
  return (kLaneIndex + static_cast<int32_t>(j)) < static_cast<int32_t>(n) ? x : Vec{};
}

// Rows i... of the scores w (R rows, P apart; keys j < n = i + rows) → exp(w - max) over each row's visible keys
// j <= i + r, zero past them; scale[r] = 1 / sum and, for the rows that exist, lse[r] = max + log(sum).
template <int R>
inline void Softmax(float* w, int64_t P, int64_t i, int64_t n, int rows, float* scale, float* lse) {
  for (int r = 0; r < R; ++r) {
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
    if (r < rows) lse[r] = m + std::log(sum);
  }
}

// Rows i... of the scores p and of dp (in ds) → the softmax p from each row's saved log-sum-exp lse[r] and
// ds = p * (dp - delta[r]) (delta = dout . out of the row); zero past each row's visible keys and in rows past the
// last.
template <int R>
inline void SoftmaxBackward(const float* lse, const float* delta, int64_t i, int64_t n, int rows, int64_t P, float* p,
                            float* ds) {
  for (int r = 0; r < R; ++r) {
    const int64_t nr = r < rows ? std::min(i + r + 1, n) : 0;
    const float l = r < rows ? lse[r] : 0.f, dr = r < rows ? delta[r] : 0.f;
    float *pr = p + r * P, *dsr = ds + r * P;
    for (int64_t j = 0; j < n; j += kLanes) {
      const Vec e = Visible(j, nr, Exp(Load(pr + j) - l));
      Store(pr + j, e);
      Store(dsr + j, e * (Load(dsr + j) - dr));
    }
  }
}

// The narrow form (heads of 4 or 8 features, or any width Wide does not take): scores and weighted sums both run
// along the keys (16 per vector), the sums over keys ending in one lane sum per row and feature.
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
      Gather<kRows>(q, s, b, i, h, qs);
      Dots<kRows>(qs, kT, K, P, n, w);
      float scale[kRows];
      Softmax<kRows>(w, P, i, n, rows, scale, lse + pair * T + i);
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
      Gather<kRows>(q, s, b, i, h, qs);
      Gather<kRows>(dout, s, b, i, h, dos);
      Dots<kRows>(qs, kT, K, P, n, p);
      Dots<kRows>(dos, vT, K, P, n, ds);  // dp
      float delta[kRows] = {};
      for (int r = 0; r < rows; ++r)
        for (int64_t c = 0; c < K; ++c) delta[r] += dos[r * K + c] * out[s.Row(b, i + r, h) + c];
      SoftmaxBackward<kRows>(lse + pair * T + i, delta, i, n, rows, P, p, ds);
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

// Heads of 16 KV features (KV = 1…4): every sum over keys (the output; the query, key and value gradients) runs
// along the features instead, KV vectors per key row, so no lane sums; R query rows share every key and value loaded
// and give the products R independent accumulators. A pair's rows are first copied out of the B x T x H x K inputs
// (prefetched, contiguous: later passes read them from L2), with R zero rows past the last.
template <int KV>
struct Wide {
  static constexpr int K = 16 * KV, R = KV <= 2 ? 8 : 4;

  static int64_t Rounded(int64_t T) { return (T + R - 1) / R * R; }

  // One pair's rows of x (T x K, then zero rows up to a multiple of R), and back.
  static void Rows(const float* x, const Shape& s, int64_t b, int64_t h, float* rows) {
    constexpr int64_t kAhead = 8;  // rows prefetched ahead: each is a separate line, H * K floats apart
    for (int64_t t = 0; t < s.T; ++t) {
      if (t + kAhead < s.T) __builtin_prefetch(x + s.Row(b, t + kAhead, h));
      std::memcpy(rows + t * K, x + s.Row(b, t, h), K * sizeof(float));
    }
    std::fill(rows + s.T * K, rows + Rounded(s.T) * K, 0.f);
  }
  static void Unrows(const float* rows, const Shape& s, int64_t b, int64_t h, float* x) {
    for (int64_t t = 0; t < s.T; ++t) std::memcpy(x + s.Row(b, t, h), rows + t * K, K * sizeof(float));
  }

  // rows (T x K) as K x P, zero past T.
  static void Transposed(const float* rows, int64_t T, int64_t P, float* xT) {
    for (int64_t k = 0; k < K; ++k) {
      for (int64_t t = 0; t < T; ++t) xT[k * P + t] = rows[t * K + k];
      std::fill(xT + k * P + T, xT + (k + 1) * P, 0.f);
    }
  }

  // acc[r] = sum_{j < n} w[r][j] x[j] (w: R rows P apart; x: rows of K).
  static void RowSums(const float* w, int64_t P, const float* x, int64_t n, Vec (&acc)[R][KV]) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < KV; ++c) acc[r][c] = Vec{};
    for (int64_t j = 0; j < n; ++j) {
      Vec xj[KV];
      for (int c = 0; c < KV; ++c) xj[c] = Load(x + j * K + kLanes * c);
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < KV; ++c) acc[r][c] += w[r * P + j] * xj[c];
    }
  }

  // dx[j] += sum_r w[r][j] y[r] for j < n (dx: rows of K; y: R rows of K).
  static void AddOuter(const float* w, int64_t P, const float* y, int64_t n, float* dx) {
    Vec yr[R][KV];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < KV; ++c) yr[r][c] = Load(y + r * K + kLanes * c);
    for (int64_t j = 0; j < n; ++j)
      for (int c = 0; c < KV; ++c) {
        Vec even = Load(dx + j * K + kLanes * c), odd{};  // two chains of R / 2 products: half the latency
        for (int r = 0; r < R; r += 2) {
          even += w[r * P + j] * yr[r][c];
          odd += w[(r + 1) * P + j] * yr[r + 1][c];
        }
        Store(dx + j * K + kLanes * c, even + odd);
      }
  }

  // R output rows from row i on (rows that exist only), each acc[r] times scale[r].
  static void Put(const Vec (&acc)[R][KV], const float* scale, const Shape& s, int64_t b, int64_t i, int64_t h,
                  int rows, float* x) {
    for (int r = 0; r < rows; ++r)
      for (int c = 0; c < KV; ++c) Store(x + s.Row(b, i + r, h) + kLanes * c, acc[r][c] * scale[r]);
  }

  struct Forward {
    const float *q, *k, *v;
    float *out, *lse;
    Shape s;

    void Pair(int64_t pair, std::vector<float>& scratch) const {
      const int64_t b = pair / s.H, h = pair % s.H, T = s.T, P = s.Padded(), TR = Rounded(T);
      scratch.resize(K * P + 3 * TR * K + R * P);
      float *kT = scratch.data(), *qr = kT + K * P, *kr = qr + TR * K, *vr = kr + TR * K, *w = vr + TR * K;
      Rows(q, s, b, h, qr);
      Rows(k, s, b, h, kr);
      Rows(v, s, b, h, vr);
      Transposed(kr, T, P, kT);
      for (int64_t i = 0; i < T; i += R) {
        const int rows = static_cast<int>(std::min<int64_t>(R, T - i));
        const int64_t n = i + rows;
        Dots<R>(qr + i * K, kT, K, P, n, w);
        float scale[R];
        Softmax<R>(w, P, i, n, rows, scale, lse + pair * T + i);
        Vec acc[R][KV];
        RowSums(w, P, vr, n, acc);
        Put(acc, scale, s, b, i, h, rows, out);
      }
    }
  };

  struct Backward {
    const float *q, *k, *v, *out, *lse, *dout;
    float *dq, *dk, *dv;
    Shape s;

    void Pair(int64_t pair, std::vector<float>& scratch) const {
      const int64_t b = pair / s.H, h = pair % s.H, T = s.T, P = s.Padded(), TR = Rounded(T);
      scratch.assign(2 * K * P + 6 * TR * K + 2 * R * P + TR, 0.f);
      float *kT = scratch.data(), *vT = kT + K * P, *qr = vT + K * P, *kr = qr + TR * K, *dor = kr + TR * K;
      float *dkr = dor + TR * K, *dvr = dkr + TR * K, *staged = dvr + TR * K, *p = staged + TR * K, *ds = p + R * P;
      float* delta = ds + R * P;
      Rows(q, s, b, h, qr);
      Rows(k, s, b, h, kr);
      Rows(dout, s, b, h, dor);
      Transposed(kr, T, P, kT);
      Rows(v, s, b, h, staged);  // values, then outputs, staged as rows
      Transposed(staged, T, P, vT);
      Rows(out, s, b, h, staged);
      for (int64_t t = 0; t < T; ++t) {  // delta = dout . out, row by row
        Vec d{};
        for (int c = 0; c < KV; ++c) d += Load(dor + t * K + kLanes * c) * Load(staged + t * K + kLanes * c);
        delta[t] = Sum(d);
      }
      float ones[R];
      std::fill(ones, ones + R, 1.f);
      for (int64_t i = 0; i < T; i += R) {
        const int rows = static_cast<int>(std::min<int64_t>(R, T - i));
        const int64_t n = i + rows;
        const float *qs = qr + i * K, *dos = dor + i * K;
        Dots<R>(qs, kT, K, P, n, p);
        Dots<R>(dos, vT, K, P, n, ds);  // dp
        SoftmaxBackward<R>(lse + pair * T + i, delta + i, i, n, rows, P, p, ds);
        Vec acc[R][KV];
        RowSums(ds, P, kr, n, acc);
        Put(acc, ones, s, b, i, h, rows, dq);
        AddOuter(ds, P, qs, n, dkr);
        AddOuter(p, P, dos, n, dvr);
      }
      Unrows(dkr, s, b, h, dk);
      Unrows(dvr, s, b, h, dv);
    }
  };
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

// Job's wide form for heads of 16, 32, 48 or 64 features, its narrow form (Forward or Backward) otherwise.
template <typename Job, typename... Buffers>
void ByWidth(ffi::ThreadPool& pool, const Shape& s, Buffers... buffers) {
  const int64_t pairs = s.B * s.H;
  auto run = [&](auto wide) {
    using Wide = decltype(wide);
    if constexpr (std::is_same_v<Job, Forward>) {
      RunPairs(pool, typename Wide::Forward{buffers..., s}, pairs);
    } else {
      RunPairs(pool, typename Wide::Backward{buffers..., s}, pairs);
    }
  };
  switch (s.K) {
    case 16: return run(Wide<1>{});
    case 32: return run(Wide<2>{});
    case 48: return run(Wide<3>{});
    case 64: return run(Wide<4>{});
    default: RunPairs(pool, Job{buffers..., s}, pairs);
  }
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
  ByWidth<Forward>(pool, s, q.typed_data(), k.typed_data(), v.typed_data(), out->typed_data(), lse->typed_data());
  return ffi::Error::Success();
}

ffi::Error BackwardImpl(ffi::ThreadPool pool, B4 q, B4 k, B4 v, B4 out, B3 lse, B4 dout,
                        ffi::ResultBuffer<ffi::F32, 4> dq, ffi::ResultBuffer<ffi::F32, 4> dk,
                        ffi::ResultBuffer<ffi::F32, 4> dv) {
  const Shape s = ShapeOf(q);
  ByWidth<Backward>(pool, s, q.typed_data(), k.typed_data(), v.typed_data(), out.typed_data(), lse.typed_data(),
                    dout.typed_data(), dq->typed_data(), dk->typed_data(), dv->typed_data());
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
