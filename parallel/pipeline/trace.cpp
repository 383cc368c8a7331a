// The per-rank trace recorder.
#include "parallel/pipeline/trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "parallel/comm/communicator.h"

namespace tripod {

namespace fs = std::filesystem;
using nlohmann::json;

std::string_view trace_category_name(TraceCategory c) {
  constexpr std::string_view names[] = {"forward", "backward", "send", "recv", "reduce", "optimizer", "cp", "other"};
  return names[static_cast<int>(c)];
}

TraceRecorder::TraceRecorder(const std::string& run_dir, int rank, int world, Coords coords,
                             const Schedule& schedule) {
  const fs::path dir = fs::path(run_dir) / "trace";
  std::error_code ec;
  fs::create_directories(dir, ec);
  TRIPOD_INPUT_CHECK(!ec, "{}: cannot create the trace folder ({})", dir.string(), ec.message());
  path_ = (dir / fmt::format("rank_{}.jsonl", rank)).string();
  file_ = std::fopen(path_.c_str(), "a");
  TRIPOD_INPUT_CHECK(file_, "{}: cannot open for writing ({})", path_, std::strerror(errno));
  json actions = json::array();
  if (coords.pp >= 0 && coords.pp < static_cast<int>(schedule.ranks.size()))
    for (const Action& a : schedule.ranks[coords.pp]) actions.push_back(a.str());
  json h = {{"tripod_trace", 1},
            {"rank", rank},
            {"world", world},
            {"coords", {{"tp", coords.tp}, {"dp", coords.dp}, {"pp", coords.pp}, {"cp", coords.cp}}},
            {"schedule",
             {{"kind", enum_name(schedule.kind)},
              {"pp", schedule.pp},
              {"vp", schedule.vp},
              {"placement", placement_name(schedule.placement)},
              {"microbatches", schedule.microbatches},
              {"actions", std::move(actions)}}}};
  header_ = h.dump();
  events_.reserve(1024);
}

TraceRecorder::~TraceRecorder() {
  if (!file_) return;
  try {
    flush();
  } catch (...) {
    // A destructor must not throw; what was buffered is lost.
  }
  std::fclose(file_);
}

void TraceRecorder::start(Communicator* world) {
  if (!enabled()) return;
  if (world) world->barrier();
  origin_ = Clock::now();
  const auto unix_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  // The header ends with the origin: splice it into the JSON object.
  std::string h = header_;
  h.pop_back();
  h += fmt::format(",\"origin_unix_us\":{}}}\n", unix_us);
  std::fputs(h.c_str(), file_);
  std::fflush(file_);
  header_.clear();  // written
}

void TraceRecorder::Span::end() {
  if (!rec_) return;
  rec_->record(name_, cat_, mb_, chunk_, start_, Clock::now());
  rec_ = nullptr;
}

void TraceRecorder::record(std::string_view name, TraceCategory cat, int mb, int chunk, Clock::time_point start,
                           Clock::time_point end) {
  if (!enabled()) return;
  events_.push_back({step_, std::string(name), cat, mb, chunk,
                     std::chrono::duration_cast<std::chrono::nanoseconds>(start - origin_).count(),
                     std::chrono::duration_cast<std::chrono::nanoseconds>(end - start).count()});
}

void TraceRecorder::flush() {
  if (!enabled()) return;
  if (!header_.empty()) start(nullptr);
  std::string buf;
  for (const Event& e : events_) {
    buf += fmt::format("{{\"step\":{},\"name\":{},\"cat\":\"{}\",\"mb\":{},\"chunk\":{},\"ts\":{:.3f},\"dur\":{:.3f}}}\n",
                       e.step, json(e.name).dump(), trace_category_name(e.cat), e.mb, e.chunk, e.start_ns / 1e3,
                       e.dur_ns / 1e3);
  }
  events_.clear();
  TRIPOD_CHECK(std::fwrite(buf.data(), 1, buf.size(), file_) == buf.size() && std::fflush(file_) == 0,
               "{}: write failed ({})", path_, std::strerror(errno));
}

}  // namespace tripod
