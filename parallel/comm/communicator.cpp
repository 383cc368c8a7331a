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

}  // namespace tripod
