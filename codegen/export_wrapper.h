// The C++ text of an exported graph's wrapper (codegen/export_wrapper.py): the preamble
// goes before the generated code, the entry points after it (they call its `run`,
// `weight_layouts` and `kNum*`).  Each section runs from its `//! section NAME` line on.
//! section preamble

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <fstream>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#define MC_CHECK(cond, what) \
    do { if (!(cond)) throw std::invalid_argument(what); } while (0)

namespace {

thread_local std::string last_error;

// Messages are plain strings, made only on a failure (no stream is ever constructed: the
// library's iostreams and the process's need not be the same build of libstdc++).
std::string mc_input(const char* name) { return std::string("input ") + name; }

void mc_check_tensor(const at::Tensor& t, const char* name, const c10::Device& device,
                     at::ScalarType dtype, int64_t dim) {
    if (!t.defined()) {
        throw std::invalid_argument(mc_input(name) + " is an undefined tensor");
    } else if (t.device() != device) {
        throw std::invalid_argument(mc_input(name) + " is on " + t.device().str() +
                                    "; the library runs on " + device.str() + " tensors");
    } else if (t.scalar_type() != dtype) {
        throw std::invalid_argument(mc_input(name) + " has dtype " +
                                    c10::toString(t.scalar_type()) + ", expected " +
                                    c10::toString(dtype));
    } else if (t.dim() != dim) {
        throw std::invalid_argument(mc_input(name) + " has " + std::to_string(t.dim()) +
                                    " dimensions, expected " + std::to_string(dim));
    }
}

void mc_check_dynamic(int64_t size, const char* name, int64_t dim, int64_t least) {
    if (size >= least) return;
    throw std::invalid_argument(
        mc_input(name) + " has size " + std::to_string(size) + " at dynamic dim " +
        std::to_string(dim) + "; dynamic sizes are at least " + std::to_string(least) +
        " (sizes 0 and 1 are specialised: export with an example of that size)");
}

void mc_check_layout(const at::Tensor& t, const char* name, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides) {
    for (size_t d = 0; d < sizes.size(); ++d) {
        if (t.size(d) != sizes[d]) {
            throw std::invalid_argument(
                mc_input(name) + " has size " + std::to_string(t.size(d)) + " at dim " +
                std::to_string(d) + ", expected " + std::to_string(sizes[d]));
        }
    }
    for (size_t d = 0; d < sizes.size(); ++d) {
        if (sizes[d] != 1 && t.stride(d) != strides[d]) {
            throw std::invalid_argument(
                mc_input(name) + " has stride " + std::to_string(t.stride(d)) + " at dim " +
                std::to_string(d) + ", expected " + std::to_string(strides[d]) +
                " (pass the layout of the example input, e.g. .contiguous())");
        }
    }
}

// A library call may choose other strides than eager's; kernels index by eager's (and
// Triton's cubins read 16-byte aligned addresses).
at::Tensor mc_with_layout(const at::Tensor& t, std::vector<int64_t> size,
                          std::vector<int64_t> stride) {
    bool same = !t.is_cuda() || reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
    for (size_t d = 0; d < size.size(); ++d) {
        same = same && (size[d] <= 1 || t.stride(d) == stride[d]);
    }
    if (same) return t;
    return at::empty_strided(size, stride, t.options()).copy_(t);
}

// A file beside this library: its path with ".so" replaced by ``suffix``.
std::string mc_file_beside(const char* suffix) {
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&mc_file_beside), &info) == 0 || !info.dli_fname) {
        throw std::runtime_error("cannot find the path of this library");
    }
    std::string path = info.dli_fname;
    if (path.size() > 3 && path.compare(path.size() - 3, 3, ".so") == 0) {
        path.resize(path.size() - 3);
    }
    return path + suffix;
}

// The weights file: "MCWEIGHTS1", the count, then per tensor its byte count and bytes
// (its storage in the layout the kernels were generated for).
std::vector<at::Tensor> mc_read_weights(const std::string& path,
                                        const std::vector<at::Tensor>& shapes) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open the weights file " + path);
    char magic[10];
    int64_t count = 0;
    f.read(magic, 10);
    f.read(reinterpret_cast<char*>(&count), 8);
    if (!f || std::memcmp(magic, "MCWEIGHTS1", 10) != 0 ||
        count != static_cast<int64_t>(shapes.size())) {
        throw std::runtime_error("the weights file " + path +
                                 " does not belong to this library");
    }
    std::vector<at::Tensor> out;
    for (const at::Tensor& t : shapes) {
        int64_t nbytes = 0;
        f.read(reinterpret_cast<char*>(&nbytes), 8);
        if (!f || nbytes != static_cast<int64_t>(t.storage().nbytes())) {
            throw std::runtime_error("the weights file " + path +
                                     " does not belong to this library");
        }
        f.read(static_cast<char*>(t.data_ptr()), nbytes);
        if (!f) throw std::runtime_error("the weights file " + path + " is truncated");
        out.push_back(t);
    }
    return out;
}

}  // namespace
//! section entry_points

static const std::vector<at::Tensor>& mc_weights() {
    static std::once_flag once;
    static std::vector<at::Tensor> weights;
    std::call_once(once, [] {
        weights = mc_read_weights(mc_file_beside(".weights"), weight_layouts());
    });
    return weights;
}

extern "C" const char* mc_last_error() { return last_error.c_str(); }

// Read the weights (and cubins) now (else the first mc_run does): 0, or 1 and the reason.
extern "C" int mc_init() {
    try {
        mc_weights();
        mc_prepare();
        return 0;
    } catch (const std::exception& e) {
        last_error = e.what();
    }
    return 1;
}
extern "C" int64_t mc_num_inputs() { return kNumInputs; }
extern "C" int64_t mc_num_outputs() { return kNumOutputs; }
extern "C" const char* mc_device_type() { return kDeviceType; }

extern "C" int mc_run(void** inputs, int64_t n_in, void** outputs, int64_t n_out) {
    std::vector<at::Tensor> args;
    for (int64_t k = 0; k < n_in; ++k) {  // ours: the handles are deleted here
        at::Tensor* handle = static_cast<at::Tensor*>(inputs[k]);
        args.push_back(std::move(*handle));
        delete handle;
    }
    try {
        if (n_in != kNumInputs || n_out != kNumOutputs) {
            throw std::invalid_argument(
                "called with " + std::to_string(n_in) + " inputs and " + std::to_string(n_out) +
                " outputs; the model takes " + std::to_string(kNumInputs) + " and returns " +
                std::to_string(kNumOutputs));
        }
        c10::AutoGradMode no_grad(false);
        std::vector<at::Tensor> given = args;  // for arguments returned as they are
        std::vector<at::Tensor> results = run(args, mc_weights());
        for (int64_t k = 0; k < n_out; ++k) {
            const int64_t* r = kReturns[k];
            outputs[k] = new at::Tensor(r[0] == 0 ? results[r[1]] : given[r[1]]);
        }
        return 0;
    } catch (const c10::Error& e) {
        last_error = e.what_without_backtrace();
    } catch (const std::exception& e) {
        last_error = e.what();
    }
    return 1;
}
