/* lmhost plugin development kit: include this one header. */
#ifndef LMHOST_PDK_H
#define LMHOST_PDK_H
#include "abi.h"
#include "debug.h"
#include "ops.h"
#include "backend.h"
#include "arch.h"
#include "cache.h"
#include "toolcall.h"
#include "build.h"
#endif
