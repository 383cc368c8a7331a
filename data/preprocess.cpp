// Preprocess: worker threads each take the next block of whole lines from the input (a short
// read under a lock), parse and encode it into the block's own token bytes (already in the
// dataset's dtype) and document lengths; this thread writes the blocks in input order, one write
// of their bytes and an append of their lengths each. Blocks are recycled, a fixed number of them
// in flight, so memory is bounded and the encoding loop allocates nothing once warm. Each worker
// has its own word cache (a shared one, read without locks, measured no faster).
#include "data/preprocess.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "data/tokenizer.h"

namespace tripod {

namespace {

using Clock = std::chrono::steady_clock;

// One block of input lines and what a worker made of it.
struct Chunk {
  std::string text;              // whole lines of the input
  std::vector<uint8_t> tokens;   // every document's tokens in the dataset's dtype, back to back
  std::vector<int32_t> lengths;  // tokens per document
  int64_t lines = 0, bad = 0, blank = 0;
  int64_t error_line = -1;       // the first bad line (0-based in the block) when bad lines are errors
  std::string why;               // and what is wrong with it
  std::exception_ptr failure;    // anything else that went wrong
};

// A worker's own encoding state: the tokenizer's cache and reused buffers.
struct Encoder {
  explicit Encoder(bool word_cache) : cache(size_t{1} << 20, word_cache) {}
  WordCache cache;
  std::vector<int> ids;
  std::string scratch, why;
};

// Parses and encodes the lines of c.text into c's tokens and lengths.
void encode_chunk(Chunk& c, const PreprocessOptions& o, InputFormat fmt, const Tokenizer& tok, TokenDType dtype,
                  Encoder& e) {
  c.tokens.clear();
  c.lengths.clear();
  c.lines = c.bad = c.blank = 0;
  c.error_line = -1;
  c.failure = nullptr;
  for_each_line(c.text, [&](std::string_view line) {
    if (c.error_line >= 0) return;
    std::string_view doc;
    const LineKind kind = extract_document_view(line, fmt, o.json_key, e.scratch, doc, e.why);
    if (kind == LineKind::Bad) {
      if (o.skip_bad_lines) {
        ++c.bad;
      } else {
        c.error_line = c.lines;
        c.why = e.why;
      }
    } else if (kind == LineKind::Blank) {
      ++c.blank;
    } else {
      tok.encode(doc, e.ids, &e.cache);
      if (o.append_eod) e.ids.push_back(tok.eod_id());
      if (e.ids.empty()) {
        ++c.blank;
      } else {
        append_tokens(dtype, e.ids, c.tokens);
        c.lengths.push_back(static_cast<int32_t>(e.ids.size()));
      }
    }
    ++c.lines;
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

// The workers and the recycled chunks. Each worker takes a free chunk, reads the next block into
// it (numbering it, under the read lock), encodes it and hands it to the writer's slot for its
// number; the writer takes the chunks in number order and gives them back. The destructor stops
// and joins the workers, so an exception in the writing thread never leaves them running.
class EncodePool {
 public:
  EncodePool(int workers, int chunks, BlockReader& reader, const PreprocessOptions& o, InputFormat fmt,
             const Tokenizer& tok, TokenDType dtype)
      : reader_(reader), ready_(static_cast<size_t>(chunks), nullptr) {
    for (int i = 0; i < chunks; ++i) {
      storage_.push_back(std::make_unique<Chunk>());
      free_.push_back(storage_.back().get());
    }
    for (int i = 0; i < workers; ++i)
      threads_.emplace_back([this, &o, fmt, &tok, dtype] {
        Encoder enc(o.word_cache);  // per thread: no locks while encoding
        while (work_one(o, fmt, tok, dtype, enc)) {
        }
      });
  }
  ~EncodePool() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    free_cv_.notify_all();
    for (auto& t : threads_) t.join();
  }

  // The next chunk in input order, waiting for it; null after the last one. A failure to read
  // the input is thrown once the blocks before it are taken.
  Chunk* next() {
    std::unique_lock lock(mu_);
    Chunk*& slot = ready_[static_cast<size_t>(next_take_ % static_cast<int64_t>(ready_.size()))];
    ready_cv_.wait(lock, [&] { return slot != nullptr || (total_ >= 0 && next_take_ >= total_); });
    if (!slot) {
      if (read_failure_) std::rethrow_exception(read_failure_);
      return nullptr;
    }
    Chunk* c = slot;
    slot = nullptr;
    ++next_take_;
    return c;
  }
  // Gives a chunk from next() back for reuse.
  void give_back(Chunk* c) {
    {
      std::lock_guard lock(mu_);
      free_.push_back(c);
    }
    free_cv_.notify_one();
  }

 private:
  // One block: false when there is nothing more to do.
  bool work_one(const PreprocessOptions& o, InputFormat fmt, const Tokenizer& tok, TokenDType dtype, Encoder& enc) {
    Chunk* c;
    {
      std::unique_lock lock(mu_);
      free_cv_.wait(lock, [&] { return stop_ || !free_.empty(); });
      if (stop_) return false;
      c = free_.back();
      free_.pop_back();
    }
    int64_t seq = -1;
    {
      std::lock_guard read_lock(read_mu_);
      if (!read_done_) {
        std::exception_ptr failure;
        bool got = false;
        try {
          got = reader_.next(c->text);
        } catch (...) {
          failure = std::current_exception();
        }
        if (got) {
          seq = next_read_++;
        } else {
          read_done_ = true;
          std::lock_guard lock(mu_);
          total_ = next_read_;
          read_failure_ = failure;
        }
      }
    }
    if (seq < 0) {
      give_back(c);
      ready_cv_.notify_all();
      return false;
    }
    try {
      encode_chunk(*c, o, fmt, tok, dtype, enc);
    } catch (...) {
      c->failure = std::current_exception();
    }
    // Only the chunk the writer waits for wakes it: a wake is a system call on each side, and
    // one per 64 KB block was a few percent of the run.
    bool wanted;
    {
      std::lock_guard lock(mu_);
      ready_[static_cast<size_t>(seq % static_cast<int64_t>(ready_.size()))] = c;
      wanted = seq == next_take_;
    }
    if (wanted) ready_cv_.notify_one();  // the writer is the one thread waiting on it
    return true;
  }

  BlockReader& reader_;
  std::mutex read_mu_;  // the reader, read_done_ and next_read_
  bool read_done_ = false;
  int64_t next_read_ = 0;

  std::mutex mu_;  // everything below
  std::condition_variable free_cv_, ready_cv_;
  std::vector<std::unique_ptr<Chunk>> storage_;
  std::vector<Chunk*> free_;
  // Encoded chunks by number modulo the chunk count: the chunks in flight are fewer than
  // that, so their numbers never share a slot.
  std::vector<Chunk*> ready_;
  int64_t next_take_ = 0, total_ = -1;  // total_: the number of blocks, once the input is read
  std::exception_ptr read_failure_;
  bool stop_ = false;
  std::vector<std::thread> threads_;
};

// User + system CPU seconds of the process (all threads) or of the calling thread.
double cpu_seconds(int who) {
  struct rusage ru {};
  ::getrusage(who, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

}  // namespace

PreprocessStats preprocess(const PreprocessOptions& o) {
  auto t0 = Clock::now();
  TRIPOD_INPUT_CHECK(o.workers >= 0 && o.workers <= kMaxPreprocessWorkers,
                     "--workers {}: must be between 1 and {}", o.workers, kMaxPreprocessWorkers);
  const int workers = o.workers > 0 ? o.workers : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  TRIPOD_INPUT_CHECK(!o.output_prefix.empty(), "--output-prefix: must not be empty");
  std::error_code ec;
  for (const std::string& out : {bin_path(o.output_prefix), idx_path(o.output_prefix)})
    TRIPOD_INPUT_CHECK(o.overwrite || !std::filesystem::exists(out, ec), "{} exists; pass --overwrite to replace it",
                       out);
  Tokenizer tok(o.tokenizer_model, o.eod_piece, o.tokenizer_pattern);
  const auto loaded = Clock::now();
  const double cpu0 = cpu_seconds(RUSAGE_SELF), writer_cpu0 = cpu_seconds(RUSAGE_THREAD);
  TRIPOD_INPUT_CHECK(!o.append_eod || tok.eod_id() >= 0,
                     "{}: the tokenizer names no end-of-document token; name one with --eod-piece (or pass --no-eod)",
                     o.tokenizer_model);
  const InputFormat fmt = resolve_input_format(o.format, o.input);
  BlockReader reader(o.input, o.block_bytes);

  PreprocessStats st;
  st.vocab_size = tok.vocab_size();
  st.dtype = dtype_for_vocab(st.vocab_size);
  st.workers = workers;
  IndexedDatasetWriter writer(o.output_prefix, st.dtype);
  ProgressLine progress(o.progress, reader.file_size());
  {
    // In flight: a block per worker being encoded and as many again finished ahead of the one
    // the writer waits for.
    EncodePool pool(workers, 2 * workers + 2, reader, o, fmt, tok, st.dtype);
    int64_t line = 1;  // the first line of the next block
    while (Chunk* c = pool.next()) {
      if (c->failure) std::rethrow_exception(c->failure);
      writer.add_documents(c->tokens, c->lengths);
      // Everything before a bad line is written in order; the temporary files go away.
      if (c->error_line >= 0)
        throw InputError(fmt::format("{}:{}: {} (--skip-bad-lines skips such lines)", o.input, line + c->error_line,
                                     c->why));
      line += c->lines;
      st.documents += static_cast<int64_t>(c->lengths.size());
      st.bad_lines += c->bad;
      st.blank_lines += c->blank;
      st.bytes += static_cast<int64_t>(c->text.size());
      pool.give_back(c);
      progress.update(st.bytes, st.documents);
    }
  }
  progress.update(st.bytes, st.documents, true);
  progress.finish();
  TRIPOD_INPUT_CHECK(st.documents > 0, "{}: no documents (empty input{})", o.input,
                     st.bad_lines ? fmt::format("; {} bad lines skipped", st.bad_lines) : std::string());
  st.tokens = writer.num_tokens();
  writer.finish();
  st.load_seconds = std::chrono::duration<double>(loaded - t0).count();
  st.seconds = std::chrono::duration<double>(Clock::now() - loaded).count();
  st.cpu_seconds = cpu_seconds(RUSAGE_SELF) - cpu0;
  st.writer_cpu_seconds = cpu_seconds(RUSAGE_THREAD) - writer_cpu0;
  return st;
}

}  // namespace tripod
