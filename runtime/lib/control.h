//===- control.h - The control plane's API: MPI's subset
//-------------------===//
//
// What ranks tell each other outside the data plane is written against MPI's
// API. The host target links Open MPI; the cuda target (PLANRT_TCP_CONTROL)
// links planrt's own implementation over TCP (lib/net/tcp_mpi.h), so that
// its programs start on GPU nodes without MPI.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_CONTROL_H
#define PLANRT_LIB_CONTROL_H

#ifdef PLANRT_TCP_CONTROL
#include "net/tcp_mpi.h"
#else
#include <mpi.h>
#endif

#endif // PLANRT_LIB_CONTROL_H
