/* CI stub: see cusparse.h. */
#pragma once
typedef struct cusolverDnContext* cusolverDnHandle_t;
