// Reading the flight recorder's dumps (<run_dir>/flight/rank_NNNNN.json) and diagnosing a hang
// from them: which ranks are blocked, in which operation, and which rank never reached the
// matching one. The diagnosis is a pure function of the rings read (tested on hand-made rings);
// `tripod trace diagnose` and rank 0's message after a timeout print it.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "parallel/comm/flight_recorder.h"

namespace tripod {

// One operation as read back.
struct FlightOp {
  uint64_t id = 0, seq = 0;
  int comm = -1;
  FlightKind kind = FlightKind::AllReduce;
  FlightState state = FlightState::Enqueued;
  int peer = -1, tag = -1;
  int64_t bytes = 0, step = 0;
  std::string phase;
  double t_enqueue = 0, t_start = 0, t_end = 0;
};

// One rank's dump.
struct FlightRing {
  int rank = 0, world_size = 1;
  std::string reason;
  double time = 0;
  std::vector<FlightComm> comms;
  std::vector<FlightOp> ops;  // oldest first
};

// Parses one dump (`origin` names it in errors). Throws InputError on anything malformed.
FlightRing parse_flight_ring(const nlohmann::json& j, const std::string& origin);
// Every run_dir/flight/rank_*.json, by rank. InputError when there is none or one is malformed.
std::vector<FlightRing> read_flight_rings(const std::string& run_dir);

struct FlightDiagnosis {
  std::vector<std::string> lines;  // a few lines for a person
  nlohmann::json json;             // the same, as data: missing, blocked, culprits, lines
};

// The diagnosis of a world of `world_size` ranks (0: the largest world_size in the rings).
FlightDiagnosis diagnose_flight(const std::vector<FlightRing>& rings, int world_size = 0);

}  // namespace tripod
