// petra/petra.hpp: the umbrella header. `#include <petra/petra.hpp>` gives the whole public API
// of the core: tensors, devices and streams, the allocator, autograd, the ops, RNG and .npy I/O.
#pragma once

#include "petra/allocator.hpp"
#include "petra/autograd.hpp"
#include "petra/config.hpp"
#include "petra/conv_impl.hpp"
#include "petra/device.hpp"
#include "petra/dtype.hpp"
#include "petra/error.hpp"
#include "petra/files.hpp"
#include "petra/npy.hpp"
#include "petra/functions.hpp"
#include "petra/ops.hpp"
#include "petra/optimizer_steps.hpp"
#include "petra/profile.hpp"
#include "petra/rng.hpp"
#include "petra/shape.hpp"
#include "petra/stream.hpp"
#include "petra/tensor.hpp"
