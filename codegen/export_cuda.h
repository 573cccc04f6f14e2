// The C++ a CUDA export adds to its wrapper (codegen/export_cuda.py), after
// export_wrapper.h's preamble: the driver API, the cubins file, launches.
//! section preamble

namespace {

// The CUDA driver API, resolved at run time: no CUDA header is needed to build the library.
using CUresult = int;
using CUcontext = void*;
using CUmodule = void*;
using CUfunction = void*;

struct McDriver {
    CUresult (*cuInit)(unsigned);
    CUresult (*cuGetErrorString)(CUresult, const char**);
    CUresult (*cuDeviceGet)(int*, int);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, int);
    CUresult (*cuCtxSetCurrent)(CUcontext);
    CUresult (*cuModuleLoadData)(CUmodule*, const void*);
    CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
    CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
    CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                               unsigned, unsigned, void*, void**, void**);
};

template <typename F>
void mc_symbol(void* lib, const char* name, F& fn) {
    fn = reinterpret_cast<F>(dlsym(lib, name));
    if (!fn) throw std::runtime_error(std::string("the CUDA driver has no ") + name);
}

const McDriver& mc_driver() {
    static const McDriver driver = [] {
        void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            throw std::runtime_error(std::string("cannot load the CUDA driver: ") + dlerror());
        }
        McDriver d{};
        mc_symbol(lib, "cuInit", d.cuInit);
        mc_symbol(lib, "cuGetErrorString", d.cuGetErrorString);
        mc_symbol(lib, "cuDeviceGet", d.cuDeviceGet);
        mc_symbol(lib, "cuDevicePrimaryCtxRetain", d.cuDevicePrimaryCtxRetain);
        mc_symbol(lib, "cuCtxSetCurrent", d.cuCtxSetCurrent);
        mc_symbol(lib, "cuModuleLoadData", d.cuModuleLoadData);
        mc_symbol(lib, "cuModuleGetFunction", d.cuModuleGetFunction);
        mc_symbol(lib, "cuFuncSetAttribute", d.cuFuncSetAttribute);
        mc_symbol(lib, "cuLaunchKernel", d.cuLaunchKernel);
        return d;
    }();
    return driver;
}

void mc_cuda_check(CUresult result, const std::string& what) {
    if (result == 0) return;
    const char* text = nullptr;
    if (mc_driver().cuGetErrorString(result, &text) != 0 || text == nullptr) text = "?";
    throw std::runtime_error(what + " failed: CUDA driver error " + std::to_string(result) +
                             " (" + text + ")");
}

struct McCubin {
    std::string name, function, codes, data;
    int64_t warps = 0, shared = 0;
};

// The cubins file beside the library (runtime/cubins.py writes it).
std::vector<McCubin> mc_read_cubins(const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    if (!f) throw std::runtime_error("cannot open the cubins file " + path);
    auto number = [&f] { int64_t n = 0; f.read(reinterpret_cast<char*>(&n), 8); return n; };
    auto blob = [&f, &number] {
        int64_t n = number();
        if (!f || n < 0 || n > (int64_t{1} << 32)) return std::string();
        std::string s(static_cast<size_t>(n), '\0');
        f.read(s.data(), n);
        return s;
    };
    char magic[9];
    f.read(magic, 9);
    int64_t count = number();
    if (!f || std::memcmp(magic, "MCCUBINS1", 9) != 0 || count != kNumKernels) {
        throw std::runtime_error("the cubins file " + path + " does not belong to this library");
    }
    std::vector<McCubin> out(count);
    for (int64_t k = 0; k < count; ++k) {
        McCubin& c = out[k];
        c.name = blob();
        c.function = blob();
        c.warps = number();
        c.shared = number();
        c.codes = blob();
        c.data = blob();
        if (!f || c.name != kKernelNames[k]) {
            throw std::runtime_error("the cubins file " + path + " does not belong here");
        }
    }
    return out;
}

const std::vector<McCubin>& mc_cubins() {
    static const std::vector<McCubin> cubins = mc_read_cubins(mc_file_beside(".cubins"));
    return cubins;
}

// A run's device: its kernels (loaded once per device) and the caller's current stream.
struct McCudaRun {
    const std::vector<CUfunction>* functions;
    void* stream;
};

McCudaRun mc_cuda_begin(const c10::Device& device) {
    static std::mutex lock;
    static std::vector<std::pair<CUcontext, std::vector<CUfunction>>> loaded(256);
    const McDriver& d = mc_driver();
    const std::vector<McCubin>& cubins = mc_cubins();
    const int index = device.index();
    std::pair<CUcontext, std::vector<CUfunction>>& slot = loaded.at(index);
    {
        std::lock_guard<std::mutex> guard(lock);
        if (slot.first == nullptr) {
            int dev = 0;
            mc_cuda_check(d.cuInit(0), "cuInit");
            mc_cuda_check(d.cuDeviceGet(&dev, index), "cuDeviceGet");
            mc_cuda_check(d.cuDevicePrimaryCtxRetain(&slot.first, dev), "cuDevicePrimaryCtxRetain");
            mc_cuda_check(d.cuCtxSetCurrent(slot.first), "cuCtxSetCurrent");
            for (const McCubin& c : cubins) {
                CUmodule module = nullptr;
                CUfunction fn = nullptr;
                mc_cuda_check(d.cuModuleLoadData(&module, c.data.data()), "loading " + c.name);
                mc_cuda_check(d.cuModuleGetFunction(&fn, module, c.function.c_str()),
                              "finding " + c.function);
                if (c.shared > 49152) {  // CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
                    mc_cuda_check(d.cuFuncSetAttribute(fn, 8, static_cast<int>(c.shared)),
                                  "allowing " + c.name + " its shared memory");
                }
                slot.second.push_back(fn);
            }
        }
    }
    mc_cuda_check(d.cuCtxSetCurrent(slot.first), "cuCtxSetCurrent");
    // The default stream (id 0) is CUDA's null stream; another, its handle.
    c10::Stream stream = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(device);
    void* handle = nullptr;
    if (stream.id() != 0) {
        try {
            handle = stream.native_handle();
        } catch (const c10::Error& e) {
            throw std::runtime_error(std::string("cannot launch on the current CUDA stream (use "
                                     "the default one with this PyTorch): ") +
                                     e.what_without_backtrace());
        }
    }
    return {&slot.second, handle};
}

int64_t mc_pointer(const at::Tensor& t) {
    auto address = reinterpret_cast<uintptr_t>(t.data_ptr());
    if (address % 16 != 0) throw std::logic_error("a kernel argument is not 16-byte aligned");
    return static_cast<int64_t>(address);
}

// Kernel k over grid programs, its arguments packed as its argument codes say.
void mc_launch(const McCudaRun& run, int64_t k, int64_t grid, std::initializer_list<int64_t> args) {
    const McCubin& c = mc_cubins()[k];
    if (grid <= 0) return;
    if (grid > std::numeric_limits<int32_t>::max()) {
        throw std::invalid_argument("the inputs are too large for " + c.name + "'s grid");
    }
    const size_t n = c.codes.size();
    std::vector<uint64_t> slots(n, 0);
    std::vector<void*> params(n);
    size_t i = 0;
    for (int64_t a : args) {
        if (i >= n || (c.codes[i] != 'O' && c.codes[i] != 'l' && c.codes[i] != 'i')) {
            throw std::logic_error(c.name + " takes other arguments (" + c.codes + ")");
        }
        if (c.codes[i] == 'i') {
            int32_t v = static_cast<int32_t>(a);
            std::memcpy(&slots[i], &v, 4);
        } else {
            std::memcpy(&slots[i], &a, 8);
        }
        ++i;
    }
    for (size_t j = 0; j < n; ++j) params[j] = &slots[j];  // (past the arguments: scratch)
    mc_cuda_check(mc_driver().cuLaunchKernel(
        (*run.functions)[k], static_cast<unsigned>(grid), 1, 1, 32 * c.warps, 1, 1,
        static_cast<unsigned>(c.shared), run.stream, params.data(), nullptr),
        "launching " + c.name);
}

// The device of a call: the first input's (checked to be CUDA), else the current one.
c10::Device mc_cuda_device(const std::vector<at::Tensor>& inputs, const char* first) {
    if (inputs.empty()) {
        return c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getDevice();
    }
    if (!inputs[0].defined() || !inputs[0].is_cuda()) {
        throw std::invalid_argument(mc_input(first) + " is not a CUDA tensor; the library runs "
                                    "on CUDA tensors");
    }
    return inputs[0].device();
}

// The weights on a device: copied there at its first call.
const std::vector<at::Tensor>& mc_weights_on(const c10::Device& device,
                                             const std::vector<at::Tensor>& weights) {
    static std::mutex lock;
    static std::vector<std::vector<at::Tensor>> copies(256);
    std::lock_guard<std::mutex> guard(lock);
    std::vector<at::Tensor>& copy = copies.at(device.index());
    if (copy.size() != weights.size()) {
        copy.clear();
        for (const at::Tensor& t : weights) {
            copy.push_back(at::empty_strided(t.sizes(), t.strides(), t.options().device(device))
                               .copy_(t));
        }
    }
    return copy;
}

// An input a kernel reads at a 16-byte aligned address (the cubins assume it): else a copy.
at::Tensor mc_aligned(at::Tensor t) {
    if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0) return t;
    return at::empty_strided(t.sizes(), t.strides(), t.options()).copy_(t);
}

void mc_prepare() { mc_cubins(); }

}  // namespace
