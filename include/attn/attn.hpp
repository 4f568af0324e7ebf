// attn: attention scoring functions. The whole public API.
#pragma once

#include "attn/additive.hpp"
#include "attn/bilinear.hpp"
#include "attn/bmm.hpp"
#include "attn/config.hpp"
#include "attn/dropout.hpp"
#include "attn/error.hpp"
#include "attn/mask.hpp"
#include "attn/multi_head.hpp"
#include "attn/nadaraya_watson.hpp"
#include "attn/optim.hpp"
#include "attn/sdpa.hpp"
#include "attn/softmax.hpp"
#include "attn/tensor.hpp"
#include "attn/train.hpp"
#include "attn/width_selection.hpp"
