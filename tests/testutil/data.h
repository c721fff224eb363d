// Test and benchmark data: deterministic generators for the kinds of chunks zrtier meets.
// Shared by the codec, store and engine tests and by `zrtier bench` (tools link runtime only, so
// the generators live in runtime/codec/sample_data.h; this header re-exports them for tests).
#pragma once

#include "runtime/codec/sample_data.h"
