//===- tcp_mpi.h - The control plane of the cuda target, without MPI ------===//
//
// What ranks tell each other outside the data plane (launch, barriers, small
// broadcasts, the pipeline's message headers, the watchdog's queries,
// checkpoint coordination, --save's gathers) is written against the subset
// of MPI's API declared here. The host target links Open MPI (each rank
// plays one GPU, and MPI is its data plane too). The cuda target, whose
// data plane is NCCL, links this implementation instead (lib/net/
// tcp_mpi.cpp), so that a cuda program starts on a GPU node without MPI:
// one process as `./prog`, many under torchrun-style variables, srun or
// mpirun (see docs/runtime.md, "Launching without MPI").
//
// Why MPI's names rather than an interface of our own: the common runtime
// (driver, watchdog, pipeline, checkpoints) keeps one control-plane code
// path for both targets, so what the host target's tests prove about it
// holds for the cuda target too. These are C++ functions: their mangled
// symbols never collide with a real MPI library's C symbols.
//
// Semantics are MPI's for what planrt uses: tags and sources (with the
// wildcards) matched in order per sender, eager (buffered) sends, collectives
// started in the same order on every member, communicators from dup/split.
//===----------------------------------------------------------------------===//
#ifndef PLANRT_LIB_NET_TCP_MPI_H
#define PLANRT_LIB_NET_TCP_MPI_H

#include <cstddef>

namespace planrt_net {
struct Comm;
struct Request;
Comm *world();
} // namespace planrt_net

#define MPI_VERSION 3
#define MPI_SUCCESS 0

typedef planrt_net::Comm *MPI_Comm;
typedef planrt_net::Request *MPI_Request;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef int MPI_Info;

struct MPI_Status {
  int MPI_SOURCE = -1;
  int MPI_TAG = -1;
  int MPI_ERROR = 0;
  size_t bytes = 0; // the message's size (MPI_Get_count)
};

#define MPI_COMM_WORLD (planrt_net::world())
#define MPI_COMM_NULL ((MPI_Comm) nullptr)
#define MPI_REQUEST_NULL ((MPI_Request) nullptr)
#define MPI_STATUS_IGNORE ((MPI_Status *)nullptr)
#define MPI_STATUSES_IGNORE ((MPI_Status *)nullptr)
#define MPI_INFO_NULL 0
#define MPI_ANY_SOURCE (-1)
#define MPI_ANY_TAG (-1)
#define MPI_UNDEFINED (-32766)
#define MPI_COMM_TYPE_SHARED 1

// Datatypes: kind << 8 | the element's size in bytes (type_size reads the
// low byte).
#define MPI_BYTE 0x101
#define MPI_CHAR 0x801
#define MPI_INT 0x204
#define MPI_FLOAT 0x304
#define MPI_DOUBLE 0x408
#define MPI_UINT16_T 0x502
#define MPI_INT64_T 0x608
#define MPI_INT32_T 0x704

#define MPI_SUM 1
#define MPI_MAX 2
#define MPI_MIN 3

int MPI_Init(int *argc, char ***argv);
int MPI_Initialized(int *flag);
int MPI_Finalized(int *flag);
int MPI_Finalize();
[[noreturn]] int MPI_Abort(MPI_Comm comm, int code);

int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Comm_dup(MPI_Comm comm, MPI_Comm *out);
int MPI_Comm_split(MPI_Comm comm, int color, int key, MPI_Comm *out);
int MPI_Comm_split_type(MPI_Comm comm, int type, int key, MPI_Info info,
                        MPI_Comm *out);
int MPI_Comm_free(MPI_Comm *comm);

int MPI_Isend(const void *buf, int count, MPI_Datatype type, int dest, int tag,
              MPI_Comm comm, MPI_Request *request);
int MPI_Irecv(void *buf, int count, MPI_Datatype type, int src, int tag,
              MPI_Comm comm, MPI_Request *request);
int MPI_Recv(void *buf, int count, MPI_Datatype type, int src, int tag,
             MPI_Comm comm, MPI_Status *status);
int MPI_Probe(int src, int tag, MPI_Comm comm, MPI_Status *status);
int MPI_Iprobe(int src, int tag, MPI_Comm comm, int *flag, MPI_Status *status);
int MPI_Get_count(const MPI_Status *status, MPI_Datatype type, int *count);

int MPI_Test(MPI_Request *request, int *flag, MPI_Status *status);
int MPI_Testall(int n, MPI_Request *requests, int *flag, MPI_Status *statuses);
int MPI_Wait(MPI_Request *request, MPI_Status *status);
int MPI_Request_free(MPI_Request *request);

int MPI_Ibarrier(MPI_Comm comm, MPI_Request *request);
int MPI_Iallreduce(const void *send, void *recv, int count, MPI_Datatype type,
                   MPI_Op op, MPI_Comm comm, MPI_Request *request);
int MPI_Ibcast(void *buf, int count, MPI_Datatype type, int root, MPI_Comm comm,
               MPI_Request *request);
int MPI_Ireduce(const void *send, void *recv, int count, MPI_Datatype type,
                MPI_Op op, int root, MPI_Comm comm, MPI_Request *request);
int MPI_Igather(const void *send, int send_count, MPI_Datatype send_type,
                void *recv, int recv_count, MPI_Datatype recv_type, int root,
                MPI_Comm comm, MPI_Request *request);

#endif // PLANRT_LIB_NET_TCP_MPI_H
