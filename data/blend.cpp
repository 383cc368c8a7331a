// Blended sample sources.
#include "data/blend.h"

#include <cmath>
#include <numeric>

#include "core/error.h"
#include "data/hash.h"

namespace tripod {

namespace {

std::vector<double> normalized(std::span<const double> w) {
  double sum = std::accumulate(w.begin(), w.end(), 0.0);
  TRIPOD_CHECK(!w.empty() && sum > 0, "blend weights must be positive");
  std::vector<double> out;
  for (double x : w) {
    TRIPOD_CHECK(x >= 0 && std::isfinite(x), "blend weight {}", x);
    out.push_back(x / sum);
  }
  return out;
}

}  // namespace

BlendIndex build_blend_index(std::span<const double> weights, int64_t n) {
  const std::vector<double> w = normalized(weights);
  const size_t k = w.size();
  BlendIndex b;
  b.source.resize(static_cast<size_t>(n));
  b.source_sample.resize(static_cast<size_t>(n));
  std::vector<int64_t> served(k, 0);
  for (int64_t i = 0; i < n; ++i) {
    const double target = static_cast<double>(std::max<int64_t>(i, 1));
    size_t best = 0;
    double best_err = w[0] * target - static_cast<double>(served[0]);
    for (size_t d = 1; d < k; ++d) {
      double err = w[d] * target - static_cast<double>(served[d]);
      if (err > best_err) best_err = err, best = d;
    }
    b.source[i] = static_cast<int64_t>(best);
    b.source_sample[i] = served[best]++;
  }
  return b;
}

std::vector<int64_t> blend_source_samples(std::span<const double> weights, int64_t n) {
  // The greedy index keeps every source within one sample of its share; Megatron's 0.5% margin
  // on top.
  std::vector<int64_t> out;
  for (double w : normalized(weights)) {
    double share = w * static_cast<double>(n);
    out.push_back(std::max<int64_t>(static_cast<int64_t>(std::ceil(share * 1.005)), static_cast<int64_t>(std::ceil(share)) + 1));
  }
  return out;
}

BlendedSource::BlendedSource(std::vector<std::unique_ptr<SampleSource>> sources, std::vector<double> weights,
                             int64_t num_samples, const std::string& cache_prefix, Communicator* sync)
    : sources_(std::move(sources)) {
  TRIPOD_CHECK(!sources_.empty() && sources_.size() == weights.size() && num_samples >= 1,
               "blend of {} sources with {} weights", sources_.size(), weights.size());
  for (const auto& s : sources_)
    TRIPOD_CHECK(s->sample_tokens() == sources_[0]->sample_tokens(), "blended sources differ in sample length");
  const std::vector<double> w = normalized(weights);
  std::string description = fmt::format("tripod blend index, format 1\nsamples: {}\nweights:", num_samples);
  for (double x : w) description += fmt::format(" {:.17g}", x);
  description += "\n";
  cache_path_ = fmt::format("{}.blend-{:016x}.gptidx", cache_prefix, hash_string(description));
  cache_ = load_or_build_cache(cache_path_, description, sync, [&] {
    BlendIndex b = build_blend_index(w, num_samples);
    std::vector<int64_t> served(w.size(), 0);  // samples asked of each source
    for (int64_t s : b.source) ++served[s];
    std::vector<CacheArray> arrays;
    arrays.push_back({"source", std::move(b.source)});
    arrays.push_back({"source_sample", std::move(b.source_sample)});
    arrays.push_back({"served", std::move(served)});
    return arrays;
  }, [&](const IndexCache& c) -> std::string {
    auto source = c.array("source"), source_sample = c.array("source_sample"), served = c.array("served");
    if (source.size() != static_cast<size_t>(num_samples) || source_sample.size() != source.size() ||
        served.size() != sources_.size())
      return fmt::format("{} samples over {} sources, want {} over {}", source.size(), served.size(), num_samples,
                         sources_.size());
    for (size_t i = 0; i < source.size(); ++i)
      if (source[i] < 0 || source[i] >= static_cast<int64_t>(sources_.size()) || source_sample[i] < 0 ||
          source_sample[i] >= sources_[source[i]]->num_samples())
        return fmt::format("sample {} names sample {} of source {}: out of range", i, source_sample[i], source[i]);
    return "";
  });
  source_ = cache_->array("source");
  source_sample_ = cache_->array("source_sample");
  auto served = cache_->array("served");
  TRIPOD_CHECK(source_.size() == static_cast<size_t>(num_samples) && source_sample_.size() == source_.size() &&
                   served.size() == sources_.size(),
               "{}: index of {} samples over {} sources, want {} over {}", cache_path_, source_.size(), served.size(),
               num_samples, sources_.size());
  for (size_t d = 0; d < sources_.size(); ++d)
    TRIPOD_CHECK(served[d] <= sources_[d]->num_samples(), "blend needs {} samples of source {} which has {}",
                 served[d], d, sources_[d]->num_samples());
}

void BlendedSource::get(int64_t index, std::span<int32_t> out) const {
  TRIPOD_CHECK(index >= 0, "negative sample index {}", index);
  const int64_t i = index % num_samples();
  const int64_t s = source_[i];
  TRIPOD_CHECK(s >= 0 && s < static_cast<int64_t>(sources_.size()), "{}: sample {} names source {}", cache_path_, i, s);
  sources_[s]->get(source_sample_[i], out);
}

}  // namespace tripod
