/* CI stub: see cusparse.h. */
#pragma once
typedef struct cublasLtContext* cublasLtHandle_t;
