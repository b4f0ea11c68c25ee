/* CI stub (.ci/run's host-glue check): the CPU torch wheel ships ATen/cuda headers but not the CUDA
 * libraries' headers they name. mok's glue uses none of these libraries; only the handle types are
 * declared, so that the headers parse. Never used for a build. */
#pragma once
typedef struct cusparseContext* cusparseHandle_t;
