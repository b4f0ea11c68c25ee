/* CI stub: see cusparse.h. */
#pragma once
typedef int cusolverStatus_t;
