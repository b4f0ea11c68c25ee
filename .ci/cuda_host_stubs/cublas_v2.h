/* CI stub: see cusparse.h. */
#pragma once
typedef struct cublasContext* cublasHandle_t;
typedef int cublasStatus_t;
