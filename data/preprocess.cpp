// Preprocess: a reader (this thread) cuts the input into blocks of lines, worker threads parse
// and encode the blocks, and this thread writes the results in block order.
#include "data/preprocess.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <chrono>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"

namespace tripod {

namespace {

using Clock = std::chrono::steady_clock;

struct Job {
  int64_t seq = 0, first_line = 0;
  std::string block;
};

struct Result {
  std::vector<int32_t> tokens;   // every document's tokens, back to back
  std::vector<int32_t> lengths;  // tokens per document
  int64_t bad = 0, blank = 0, bytes = 0;
  std::string error;             // the first bad line, when bad lines are errors
  std::exception_ptr failure;    // anything else that went wrong
};

// Parses and encodes one block of lines.
void encode_block(const Job& job, const PreprocessOptions& o, InputFormat fmt, const Tokenizer& tok, WordCache* cache,
                  Result& r) {
  r.bytes = static_cast<int64_t>(job.block.size());
  std::string text, why;
  std::vector<int> ids;
  int64_t line_no = job.first_line;
  for_each_line(job.block, [&](std::string_view line) {
    if (!r.error.empty()) return;
    LineKind kind = extract_document(line, fmt, o.json_key, text, why);
    if (kind == LineKind::Bad) {
      if (o.skip_bad_lines)
        ++r.bad;
      else
        r.error = fmt::format("{}:{}: {} (--skip-bad-lines skips such lines)", o.input, line_no, why);
    } else if (kind == LineKind::Blank) {
      ++r.blank;
    } else {
      tok.encode(text, ids, cache);
      if (o.append_eod) ids.push_back(tok.eod_id());
      if (ids.empty()) {
        ++r.blank;
      } else {
        r.tokens.insert(r.tokens.end(), ids.begin(), ids.end());
        r.lengths.push_back(static_cast<int32_t>(ids.size()));
      }
    }
    ++line_no;
  });
}

// "12.3 MB"-style sizes and "1:02:03" durations for the progress line.
std::string human_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60) : fmt::format("{}:{:02}", t / 60, t % 60);
}

class ProgressLine {
 public:
  ProgressLine(bool enabled, int64_t total_bytes) : enabled_(enabled && ::isatty(STDERR_FILENO)), total_(total_bytes) {}
  void update(int64_t bytes, int64_t docs, bool force = false) {
    if (!enabled_) return;
    auto now = Clock::now();
    if (!force && now - last_ < std::chrono::milliseconds(200)) return;
    last_ = now;
    double s = std::chrono::duration<double>(now - start_).count();
    double mbps = s > 0 ? bytes / 1e6 / s : 0, dps = s > 0 ? docs / s : 0;
    double eta = bytes > 0 && total_ > 0 ? s * static_cast<double>(total_ - bytes) / static_cast<double>(bytes) : -1;
    double pct = total_ > 0 ? 100.0 * static_cast<double>(bytes) / static_cast<double>(total_) : 0;
    fmt::print(stderr, "\rpreprocess {:5.1f}%  {:.1f}/{:.1f} MB  {} docs  {:.0f} docs/s  {:.2f} MB/s  ETA {}   ", pct,
               bytes / 1e6, total_ / 1e6, docs, dps, mbps, human_duration(eta));
    std::fflush(stderr);
    shown_ = true;
  }
  void finish() {
    if (shown_) fmt::print(stderr, "\n");
  }

 private:
  bool enabled_, shown_ = false;
  int64_t total_;
  Clock::time_point start_ = Clock::now(), last_{};
};

// The worker pool and its two queues. The destructor stops and joins the workers, so an
// exception in the writing thread never leaves them running.
class EncodePool {
 public:
  EncodePool(int workers, const PreprocessOptions& o, InputFormat fmt, const Tokenizer& tok) {
    for (int i = 0; i < workers; ++i)
      threads_.emplace_back([this, &o, fmt, &tok] {
        WordCache cache(size_t{1} << 20, o.word_cache);  // per thread: no locks
        while (true) {
          Job job;
          {
            std::unique_lock lock(mu_);
            work_cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
            if (jobs_.empty()) return;  // stopping and nothing left
            job = std::move(jobs_.front());
            jobs_.pop_front();
          }
          Result r;
          if (!cancel_) {
            try {
              encode_block(job, o, fmt, tok, &cache, r);
            } catch (...) {
              r.failure = std::current_exception();
            }
          }
          {
            std::lock_guard lock(mu_);
            results_.emplace(job.seq, std::move(r));
          }
          done_cv_.notify_all();
        }
      });
  }
  ~EncodePool() {
    cancel_ = true;
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void push(Job job) {
    {
      std::lock_guard lock(mu_);
      jobs_.push_back(std::move(job));
    }
    work_cv_.notify_one();
  }
  // The result of block `seq`, waiting for it when `wait`; false when not ready.
  bool take(int64_t seq, Result& out, bool wait) {
    std::unique_lock lock(mu_);
    if (wait) done_cv_.wait_for(lock, std::chrono::milliseconds(200), [&] { return results_.count(seq) > 0; });
    auto it = results_.find(seq);
    if (it == results_.end()) return false;
    out = std::move(it->second);
    results_.erase(it);
    return true;
  }

 private:
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> jobs_;
  std::map<int64_t, Result> results_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
  std::atomic<bool> cancel_{false};
};

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& o) {
  auto t0 = Clock::now();
  TRIPOD_INPUT_CHECK(o.workers >= 0 && o.workers <= 256, "--workers {}: must be between 0 (all cores) and 256",
                     o.workers);
  const int workers = o.workers > 0 ? o.workers : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  TRIPOD_INPUT_CHECK(!o.output_prefix.empty(), "--output-prefix: must not be empty");
  std::error_code ec;
  for (const std::string& out : {bin_path(o.output_prefix), idx_path(o.output_prefix)})
    TRIPOD_INPUT_CHECK(o.overwrite || !std::filesystem::exists(out, ec), "{} exists; pass --overwrite to replace it",
                       out);
  Tokenizer tok(o.tokenizer_model, o.eod_piece, o.tokenizer_pattern);
  const auto loaded = Clock::now();
  TRIPOD_INPUT_CHECK(!o.append_eod || tok.eod_id() >= 0,
                     "{}: the tokenizer names no end-of-document token; name one with --eod-piece (or pass --no-eod)",
                     o.tokenizer_model);
  const InputFormat fmt = resolve_input_format(o.format, o.input);
  BlockReader reader(o.input, o.block_bytes);

  PreprocessStats st;
  st.vocab_size = tok.vocab_size();
  st.dtype = dtype_for_vocab(st.vocab_size);
  IndexedDatasetWriter writer(o.output_prefix, st.dtype);
  ProgressLine progress(o.progress, reader.file_size());
  {
    EncodePool pool(workers, o, fmt, tok);
    const int64_t max_in_flight = 2 * workers + 2;  // bounds memory: blocks read but not written
    int64_t next_seq = 0, next_write = 0;
    auto write_ready = [&](bool wait) {
      Result r;
      while (next_write < next_seq && pool.take(next_write, r, wait)) {
        if (r.failure) std::rethrow_exception(r.failure);
        size_t at = 0;
        for (int32_t len : r.lengths) {
          writer.add_document(std::span<const int32_t>(r.tokens.data() + at, static_cast<size_t>(len)));
          at += static_cast<size_t>(len);
        }
        // Everything before the bad line is written in order; the temporary files go away.
        if (!r.error.empty()) throw InputError(r.error);
        st.documents += static_cast<int64_t>(r.lengths.size());
        st.bad_lines += r.bad;
        st.blank_lines += r.blank;
        st.bytes += r.bytes;
        ++next_write;
        progress.update(st.bytes, st.documents);
      }
    };
    Job job;
    while (reader.next(job.block, job.first_line)) {
      job.seq = next_seq++;
      pool.push(std::move(job));
      job = Job{};
      write_ready(false);
      while (next_seq - next_write >= max_in_flight) write_ready(true);
    }
    while (next_write < next_seq) write_ready(true);
  }
  progress.update(st.bytes, st.documents, true);
  progress.finish();
  TRIPOD_INPUT_CHECK(st.documents > 0, "{}: no documents (empty input{})", o.input,
                     st.bad_lines ? fmt::format("; {} bad lines skipped", st.bad_lines) : std::string());
  st.tokens = writer.num_tokens();
  writer.finish();
  st.load_seconds = std::chrono::duration<double>(loaded - t0).count();
  st.seconds = std::chrono::duration<double>(Clock::now() - loaded).count();
  return st;
}

}  // namespace tripod
