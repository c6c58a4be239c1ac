// ddp-cpp: distributed data-parallel training for libtorch. Include this one header.
#pragma once

#include "ddp/checkpoint.h"
#include "ddp/collectives.h"
#include "ddp/comm_hooks.h"
#include "ddp/data_parallel.h"
#include "ddp/ddp_stats.h"
#include "ddp/device.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/distributed_sampler.h"
#include "ddp/errors.h"
#include "ddp/init.h"
#include "ddp/join.h"
#include "ddp/mixed_precision.h"
#include "ddp/powersgd_hook.h"
#include "ddp/process_group.h"
#include "ddp/sync_batchnorm.h"
#include "ddp/zero_redundancy_optimizer.h"
