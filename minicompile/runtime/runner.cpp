// minicompile_runner: run an exported minicompile library without Python.
//   minicompile_runner model.so inputs.pt outputs.pt [repeats]
// inputs.pt: a tensor, or a list or tuple of tensors, saved with torch.save;
// outputs.pt: the model's outputs as a tuple, for torch.load.  With repeats, the model
// runs that many more times and the median time of a run is printed.  A CUDA library
// runs on GPU 0 (the inputs are copied there, on the default stream; each timed run waits
// for the GPU), and its outputs are saved as CPU tensors.
#include <ATen/core/ivalue.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/jit/serialization/pickle.h>

#include <dlfcn.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

using RunFn = int (*)(void**, int64_t, void**, int64_t);

int main(int argc, char** argv) {
    if (argc != 4 && argc != 5) {
        std::cerr << "usage: " << argv[0] << " model.so inputs.pt outputs.pt [repeats]\n";
        return 2;
    }
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        std::cerr << "cannot load " << argv[1] << ": " << dlerror() << "\n";
        return 1;
    }
    auto run = reinterpret_cast<RunFn>(dlsym(lib, "mc_run"));
    auto last_error = reinterpret_cast<const char* (*)()>(dlsym(lib, "mc_last_error"));
    auto num_outputs = reinterpret_cast<int64_t (*)()>(dlsym(lib, "mc_num_outputs"));
    if (!run || !last_error || !num_outputs) {
        std::cerr << argv[1] << " is not a library exported by minicompile\n";
        return 1;
    }
    std::ifstream in(argv[2], std::ios::binary);
    if (!in) {
        std::cerr << "cannot read " << argv[2] << "\n";
        return 1;
    }
    std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<at::Tensor> tensors;
    try {
        c10::IValue saved = torch::jit::pickle_load(data);
        std::vector<c10::IValue> items;
        if (saved.isTensor()) {
            items.push_back(saved);
        } else if (saved.isTuple()) {
            items = saved.toTupleRef().elements().vec();
        } else {
            items = saved.toList().vec();
        }
        for (const c10::IValue& item : items) tensors.push_back(item.toTensor());
    } catch (const std::exception& e) {
        std::cerr << argv[2] << " does not hold a tensor or a list of tensors: " << e.what()
                  << "\n";
        return 1;
    }
    auto device_type = reinterpret_cast<const char* (*)()>(dlsym(lib, "mc_device_type"));
    const bool cuda = device_type && std::string(device_type()) == "cuda";
    const c10::Device gpu(c10::DeviceType::CUDA, 0);
    try {
        if (cuda) {  // (PyTorch's CUDA half, if libtorch did not load it)
            dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_GLOBAL);
            for (at::Tensor& t : tensors) t = t.to(at::TensorOptions().device(gpu));
        }
    } catch (const std::exception& e) {
        std::cerr << "cannot copy the inputs to the GPU: " << e.what() << "\n";
        return 1;
    }
    auto wait = [&]() {
        if (cuda) {
            const auto* impl = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
            impl->synchronizeStream(impl->getStream(gpu));
        }
    };
    std::vector<void*> outputs(num_outputs());
    auto run_once = [&]() {  // mc_run takes over (deletes) the input handles
        std::vector<void*> inputs;
        for (const at::Tensor& t : tensors) inputs.push_back(new at::Tensor(t));
        return run(inputs.data(), inputs.size(), outputs.data(), outputs.size());
    };
    if (run_once() != 0) {
        std::cerr << "the model failed: " << last_error() << "\n";
        return 1;
    }
    int repeats = argc == 5 ? std::atoi(argv[4]) : 0;
    std::vector<double> times;
    for (int k = 0; k < repeats; ++k) {
        for (void* handle : outputs) delete static_cast<at::Tensor*>(handle);
        auto start = std::chrono::steady_clock::now();
        if (run_once() != 0) {
            std::cerr << "the model failed: " << last_error() << "\n";
            return 1;
        }
        wait();
        times.push_back(std::chrono::duration<double, std::milli>(
            std::chrono::steady_clock::now() - start).count());
    }
    if (!times.empty()) {
        std::sort(times.begin(), times.end());
        std::cerr << "minicompile_runner: " << times[times.size() / 2] << " ms a run (median of "
                  << times.size() << ")\n";
    }
    std::vector<c10::IValue> results;
    for (void* handle : outputs) {
        at::Tensor* t = static_cast<at::Tensor*>(handle);
        results.emplace_back(cuda ? t->cpu() : *t);
        delete t;
    }
    auto tuple = c10::ivalue::Tuple::create(std::move(results));
    std::vector<char> bytes = torch::jit::pickle_save(tuple);
    std::ofstream out(argv[3], std::ios::binary);
    out.write(bytes.data(), bytes.size());
    return out ? 0 : 1;
}
