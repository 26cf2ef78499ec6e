/// @file
/// A small multilayer perceptron in plain C++ for the examples and the convergence tests:
/// dense layers with ReLU between them, softmax cross-entropy, SGD with momentum.
///
/// All parameters live in one flat buffer, and so do their gradients, in the same layout
/// (layer by layer: weights row-major [out][in], then biases), so that data-parallel training
/// reduces the gradients with one collective call per step. Everything is deterministic: the
/// initialization draws from a seeded counter-based generator (not std::normal_distribution,
/// whose output differs between standard libraries) and the arithmetic runs in a fixed order.
#pragma once

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <utility>
#include <vector>

namespace cohort::examples {

/// Labelled examples: `count` rows of `features` floats, and a class per row.
struct dataset {
  std::size_t features = 0;  ///< Floats per example.
  std::size_t classes = 0;   ///< Labels are in [0, classes).
  std::vector<float> x;      ///< count * features, row-major.
  std::vector<int> y;        ///< count labels.

  /// The number of examples.
  std::size_t size() const noexcept { return y.size(); }
  /// The features of example i.
  std::span<const float> row(std::size_t i) const { return {x.data() + i * features, features}; }
};

/// A reproducible uniform double in [0, 1) from (seed, i) (splitmix64).
inline double uniform01(std::uint64_t seed, std::uint64_t i) noexcept {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ull + i + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<double>((z ^ (z >> 31)) >> 11) * 0x1p-53;
}

/// A reproducible permutation of [0, n) (Fisher-Yates driven by `uniform01`).
inline std::vector<std::size_t> permutation(std::size_t n, std::uint64_t seed) {
  std::vector<std::size_t> p(n);
  for (std::size_t i = 0; i < n; ++i) p[i] = i;
  for (std::size_t i = n; i > 1; --i)
    std::swap(p[i - 1], p[static_cast<std::size_t>(uniform01(seed, i) * static_cast<double>(i))]);
  return p;
}

/// Splits `d` into (train, test) with `test_fraction` of the examples, shuffled by `seed`.
inline std::pair<dataset, dataset> split(const dataset& d, double test_fraction,
                                         std::uint64_t seed) {
  const auto order = permutation(d.size(), seed);
  const auto n_test = static_cast<std::size_t>(test_fraction * static_cast<double>(d.size()));
  dataset parts[2] = {{d.features, d.classes, {}, {}}, {d.features, d.classes, {}, {}}};
  for (std::size_t k = 0; k < order.size(); ++k) {
    dataset& part = parts[k < n_test ? 1 : 0];
    const auto r = d.row(order[k]);
    part.x.insert(part.x.end(), r.begin(), r.end());
    part.y.push_back(d.y[order[k]]);
  }
  return {std::move(parts[0]), std::move(parts[1])};
}

/// Dense layers with ReLU between them and softmax cross-entropy at the end.
class mlp {
 public:
  /// Layers of the given widths, e.g. {64, 64, 10}; He-initialized weights, zero biases.
  mlp(std::vector<std::size_t> widths, std::uint64_t seed) : widths_(std::move(widths)) {
    assert(widths_.size() >= 2);
    std::size_t total = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      offsets_.push_back(total);
      total += widths_[l + 1] * widths_[l] + widths_[l + 1];
    }
    params_.assign(total, 0.0f);
    grads_.assign(total, 0.0f);
    std::uint64_t draw = 0;
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const double sd = std::sqrt(2.0 / static_cast<double>(widths_[l]));
      float* w = weights(l);
      for (std::size_t i = 0; i < widths_[l + 1] * widths_[l]; ++i, draw += 2) {
        const double u1 = uniform01(seed, draw), u2 = uniform01(seed, draw + 1);
        w[i] = static_cast<float>(sd * std::sqrt(-2.0 * std::log(1.0 - u1)) *
                                  std::cos(6.283185307179586 * u2));
      }
    }
    acts_.resize(widths_.size());
  }

  /// Every weight and bias, in one buffer.
  std::span<float> parameters() noexcept { return params_; }
  std::span<const float> parameters() const noexcept { return params_; }
  /// The gradients of the last `backward_batch`, in the layout of `parameters()`.
  std::span<float> gradients() noexcept { return grads_; }
  /// Input features and classes.
  std::size_t inputs() const noexcept { return widths_.front(); }
  std::size_t classes() const noexcept { return widths_.back(); }

  /// Number of dense layers.
  std::size_t layers() const noexcept { return widths_.size() - 1; }
  /// The gradients of layer `l` (its weights, then its biases) inside `gradients()`.
  std::span<float> layer_gradients(std::size_t l) noexcept {
    return {grads_.data() + offsets_[l], widths_[l + 1] * widths_[l] + widths_[l + 1]};
  }

  /// Forward and backward over examples `rows` of `d`, the whole batch one layer at a time:
  /// sets `gradients()` to the gradient of the mean cross-entropy over them (adds to it when
  /// `add`) and returns that mean loss. `layer_done(l)` is called as soon as layer l's
  /// gradients are final, top layer first, so that their reduction can start while the
  /// layers below are still being computed.
  float backward_batch(const dataset& d, std::span<const std::size_t> rows, bool add = false,
                       const std::function<void(std::size_t)>& layer_done = {}) {
    if (!add) std::fill(grads_.begin(), grads_.end(), 0.0f);
    const std::size_t batch = rows.size(), top = layers();
    batch_acts_.resize(widths_.size());
    // Forward: batch_acts_[l] is batch x widths_[l], softmax probabilities on top.
    batch_acts_[0].resize(batch * widths_[0]);
    for (std::size_t b = 0; b < batch; ++b) {
      const auto x = d.row(rows[b]);
      std::copy(x.begin(), x.end(), batch_acts_[0].begin() + b * widths_[0]);
    }
    // Each output sums over its inputs in order, as `forward` does for one example, but the
    // batch's examples are summed side by side (inputs transposed to in x batch), which the
    // compiler vectorizes without reordering any sum: the results are the same bits.
    for (std::size_t l = 0; l < top; ++l) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      const float* w = weights(l);
      const float* bias = w + out * in;
      const float* a = batch_acts_[l].data();
      batch_acts_[l + 1].resize(batch * out);
      float* z = batch_acts_[l + 1].data();
      transposed_.resize(in * batch);
      for (std::size_t b = 0; b < batch; ++b)
        for (std::size_t i = 0; i < in; ++i) transposed_[i * batch + b] = a[b * in + i];
      sums_.resize(batch);
      for (std::size_t o = 0; o < out; ++o) {
        float* s = sums_.data();
        std::fill(s, s + batch, bias[o]);
        for (std::size_t i = 0; i < in; ++i) {
          const float wi = w[o * in + i];
          const float* column = transposed_.data() + i * batch;
          for (std::size_t b = 0; b < batch; ++b) s[b] += wi * column[b];
        }
        for (std::size_t b = 0; b < batch; ++b)
          z[b * out + o] = l + 1 < top ? std::max(s[b], 0.0f) : s[b];
      }
    }
    // Softmax cross-entropy: dL/dlogit = (softmax - onehot) / batch.
    double loss = 0.0;
    std::vector<float>& delta = batch_delta_;
    delta.assign(batch * widths_[top], 0.0f);
    const float inv = 1.0f / static_cast<float>(batch);
    for (std::size_t b = 0; b < batch; ++b) {
      float* z = batch_acts_[top].data() + b * widths_[top];
      const float m = *std::max_element(z, z + widths_[top]);
      double sum = 0.0;
      for (std::size_t o = 0; o < widths_[top]; ++o) sum += (z[o] = std::exp(z[o] - m));
      const auto label = static_cast<std::size_t>(d.y[rows[b]]);
      for (std::size_t o = 0; o < widths_[top]; ++o) {
        z[o] = static_cast<float>(z[o] / sum);
        delta[b * widths_[top] + o] = (z[o] - (o == label ? 1.0f : 0.0f)) * inv;
      }
      loss -= std::log(std::max(static_cast<double>(z[label]), 1e-30));
    }
    // Backward, top layer first.
    for (std::size_t l = top; l-- > 0;) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      float* gw = grads_.data() + offsets_[l];
      float* gb = gw + out * in;
      for (std::size_t b = 0; b < batch; ++b) {
        const float* a = batch_acts_[l].data() + b * in;
        const float* dz = delta.data() + b * out;
        for (std::size_t o = 0; o < out; ++o) {
          gb[o] += dz[o];
          for (std::size_t i = 0; i < in; ++i) gw[o * in + i] += dz[o] * a[i];
        }
      }
      if (layer_done) layer_done(l);
      if (l == 0) break;
      std::vector<float>& below = batch_delta_below_;
      below.assign(batch * in, 0.0f);
      const float* w = weights(l);
      for (std::size_t b = 0; b < batch; ++b) {
        const float* dz = delta.data() + b * out;
        const float* a = batch_acts_[l].data() + b * in;
        float* da = below.data() + b * in;
        for (std::size_t o = 0; o < out; ++o)
          for (std::size_t i = 0; i < in; ++i) da[i] += w[o * in + i] * dz[o];
        for (std::size_t i = 0; i < in; ++i) da[i] = a[i] > 0.0f ? da[i] : 0.0f;  // ReLU'
      }
      delta.swap(below);
    }
    return static_cast<float>(loss / static_cast<double>(batch));
  }

  /// The mean cross-entropy over all of `d`.
  double loss(const dataset& d) {
    double sum = 0.0;
    for (std::size_t r = 0; r < d.size(); ++r) sum += forward(d.row(r), d.y[r]);
    return d.size() == 0 ? 0.0 : sum / static_cast<double>(d.size());
  }
  /// The fraction of `d` classified correctly.
  double accuracy(const dataset& d) {
    std::size_t right = 0;
    for (std::size_t r = 0; r < d.size(); ++r) {
      forward(d.row(r), d.y[r]);
      const auto& p = acts_.back();
      right += static_cast<int>(std::max_element(p.begin(), p.end()) - p.begin()) == d.y[r];
    }
    return d.size() == 0 ? 0.0 : static_cast<double>(right) / static_cast<double>(d.size());
  }

 private:
  float* weights(std::size_t l) noexcept { return params_.data() + offsets_[l]; }

  // Runs one example; leaves activations in acts_ (softmax probabilities last); returns its
  // cross-entropy.
  double forward(std::span<const float> x, int label) {
    acts_[0].assign(x.begin(), x.end());
    for (std::size_t l = 0; l + 1 < widths_.size(); ++l) {
      const std::size_t in = widths_[l], out = widths_[l + 1];
      const float* w = weights(l);
      const float* b = w + out * in;
      std::vector<float>& z = acts_[l + 1];
      z.assign(out, 0.0f);
      for (std::size_t o = 0; o < out; ++o) {
        float s = b[o];
        for (std::size_t i = 0; i < in; ++i) s += w[o * in + i] * acts_[l][i];
        z[o] = l + 2 < widths_.size() ? std::max(s, 0.0f) : s;
      }
    }
    std::vector<float>& p = acts_.back();
    const float m = *std::max_element(p.begin(), p.end());
    double sum = 0.0;
    for (float& v : p) sum += (v = std::exp(v - m));
    for (float& v : p) v = static_cast<float>(v / sum);
    return -std::log(std::max(static_cast<double>(p[static_cast<std::size_t>(label)]), 1e-30));
  }

  std::vector<std::size_t> widths_;
  std::vector<std::size_t> offsets_;
  std::vector<float> params_, grads_;
  std::vector<std::vector<float>> acts_;  // one example's activations (loss, accuracy)
  std::vector<std::vector<float>> batch_acts_;  // per layer, batch x width
  std::vector<float> batch_delta_, batch_delta_below_;
  // The batched forward pass: one layer's inputs, transposed (in x batch), and their sums.
  std::vector<float> transposed_, sums_;
};

/// Stochastic gradient descent with momentum: v = momentum * v + g; p -= scale * lr * v.
class sgd {
 public:
  /// Learning rate and momentum.
  sgd(float lr, float momentum) : lr_(lr), momentum_(momentum) {}

  /// Multiplies the learning rate from the next step on (for warm-up schedules).
  void set_scale(float scale) { scale_ = scale; }

  /// Applies one step with gradients `g` to `params` (same size every call).
  void step(std::span<float> params, std::span<const float> g) {
    if (velocity_.size() != params.size()) velocity_.assign(params.size(), 0.0f);
    for (std::size_t i = 0; i < params.size(); ++i) {
      velocity_[i] = momentum_ * velocity_[i] + g[i];
      params[i] -= scale_ * lr_ * velocity_[i];
    }
  }

 private:
  float lr_, momentum_, scale_ = 1.0f;
  std::vector<float> velocity_;
};

}  // namespace cohort::examples
