// The LibTorch headers every kernel, plugin and test file uses, precompiled once.
#pragma once
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/version.h>
