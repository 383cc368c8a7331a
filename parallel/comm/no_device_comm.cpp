// Builds without a GPU backend: MPI carries every tensor.
#include "parallel/comm/device_comm.h"

namespace tripod {

DeviceCommFactory device_comm_factory(const MpiComm&, bool) { return {}; }

}  // namespace tripod
