// The warper (temperature, top-k, top-p, min-p), exposed for tests against an independent reference.
#include "bindings.h"

#include "specllm/sampling.h"

#include <vector>

using namespace specllm;

void register_sampling(py::module_ & m) {
    m.def("warp", [](const std::vector<float> & logits, const SamplingOptions & opts) {
        if (logits.empty()) {
            throw py::value_error("logits must not be empty");
        }
        check_sampling_options(opts);
        if (opts.temperature <= 0.0f) {
            throw py::value_error("warp needs a temperature > 0 (temperature 0 is greedy: the argmax)");
        }
        Warper w;
        Dist d;
        w.warp(logits.data(), (int) logits.size(), opts, d);
        return py::make_tuple(d.ids, d.probs);
    }, py::arg("logits"), py::arg("opts"), "(ids, probs) of the warped distribution of one row of logits");
}
