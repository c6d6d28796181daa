// The CPU backend's worker threads, per calling thread.
//
// llama.cpp's CPU backend, built with OpenMP (llama-cpp-python's wheel is), keeps for every thread that has decoded a
// pool of n_threads - 1 workers, alive as long as that thread is. While more OpenMP threads are alive than the machine
// has cores, libgomp stops spinning at its barriers (its "throttled" spin count) and each of the hundreds of barriers
// in a decode sleeps and is woken: on a 2-core EPYC a 1-row step decoded by a second thread cost 32 ms against 26 on
// the first, and a batch of 2 rows 1.5 such steps against 1.7. So a cost profile measured on the load's own thread
// after the main thread had generated read every batch ~20% cheaper against a plain step than it was, and "auto"
// drafted where it lost (bench/README, "One pool of CPU threads"). A thread that is done decoding for now releases
// its pool: the next decode on it starts a new one (one thread started, ~0.1 ms).
#pragma once

namespace specllm {

// release the calling thread's OpenMP worker pool (omp_pause_resource_all, looked up at run time: a libllama built
// without OpenMP has none). True if released (or there was none to release); false where there is no OpenMP or the
// caller is inside a parallel region. Never call it from inside a decode.
bool release_compute_threads();

} // namespace specllm
