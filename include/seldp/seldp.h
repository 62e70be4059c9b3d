/** @file
 * seldp: selected data parallelism for mixture-of-experts training.
 * Include this one header for the whole public API. */
#ifndef SELDP_H
#define SELDP_H

#include "seldp/status.h"
#include "seldp/dtype.h"
#include "seldp/tensor.h"
#include "seldp/model.h"
#include "seldp/grads.h"
#include "seldp/comm.h"
#include "seldp/host.h"
#include "seldp/session.h"
#include "seldp/layout.h"
#include "seldp/gradnorm.h"
#include "seldp/shard.h"
#include "seldp/version.h"

#endif
