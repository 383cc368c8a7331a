// The collective error check every rank takes part in (see communicator.h).
#include "parallel/comm/communicator.h"

#include "core/allocator.h"
#include "core/error.h"

namespace tripod {

void throw_if_any_failed(const std::string& error, Communicator& world) {
  // Max over ranks of (size - rank) for a failed rank: the lowest failing rank; and of 1 for a
  // rank that succeeded: whether the failure is every rank's.
  CpuAllocator host;
  Tensor flags = Tensor::empty(host, {2}, DType::F32, MemCategory::Workspace);
  flags.data<float>()[0] = error.empty() ? 0.f : static_cast<float>(world.size() - world.rank());
  flags.data<float>()[1] = error.empty() ? 1.f : 0.f;
  world.all_reduce(flags, ReduceOp::Max);
  if (flags.data<float>()[0] == 0.f) return;
  const int failing = world.size() - static_cast<int>(flags.data<float>()[0]);
  const bool some_succeeded = flags.data<float>()[1] > 0.f;
  using Scope = InputError::Scope;
  if (failing == world.rank()) throw InputError(error, some_succeeded ? Scope::Rank : Scope::Shared);
  throw InputError::reported_elsewhere();
}

void check_all_to_all_v(const Communicator& c, const Tensor& in, std::span<const int64_t> send_counts,
                        const Tensor& out, std::span<const int64_t> recv_counts) {
  const auto n = static_cast<size_t>(c.size());
  TRIPOD_CHECK(send_counts.size() == n && recv_counts.size() == n,
               "all_to_all_v on '{}': {} send and {} receive counts for {} ranks", c.name(), send_counts.size(),
               recv_counts.size(), n);
  int64_t sent = 0, received = 0;
  for (size_t r = 0; r < n; ++r) {
    TRIPOD_CHECK(send_counts[r] >= 0 && recv_counts[r] >= 0, "all_to_all_v on '{}': a negative count for rank {}",
                 c.name(), r);
    sent += send_counts[r];
    received += recv_counts[r];
  }
  TRIPOD_CHECK(in.dtype() == out.dtype() && in.numel() >= sent && out.numel() >= received,
               "all_to_all_v on '{}': {} elements from {}, {} into {}", c.name(), sent, in.str(), received, out.str());
}

}  // namespace tripod
