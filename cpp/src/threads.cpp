// release_compute_threads: see threads.h
#include "specllm/threads.h"

#include <atomic>
#include <initializer_list>

#if defined(__unix__) || defined(__APPLE__)
#include <dlfcn.h>
#endif

namespace specllm {

namespace {

using pause_fn = int (*)(int);

pause_fn find_pause() {
#if defined(__unix__) || defined(__APPLE__)
    // the OpenMP runtime libggml-cpu was linked with, loaded with it (not by this library: RTLD_NOLOAD)
    for (const char * lib : {"libgomp.so.1", "libomp.so", "libomp.dylib", "libiomp5.so"}) {
        if (void * handle = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD)) {
            if (void * fn = dlsym(handle, "omp_pause_resource_all")) {
                return reinterpret_cast<pause_fn>(fn);
            }
        }
    }
    return reinterpret_cast<pause_fn>(dlsym(RTLD_DEFAULT, "omp_pause_resource_all"));
#else
    return nullptr;
#endif
}

} // namespace

bool release_compute_threads() {
    static std::atomic<pause_fn> found{nullptr}; // looked up again while not found: the runtime may load later
    pause_fn pause = found.load();
    if (pause == nullptr) {
        pause = find_pause();
        found.store(pause);
    }
    constexpr int omp_pause_soft = 1;
    return pause != nullptr && pause(omp_pause_soft) == 0;
}

} // namespace specllm
