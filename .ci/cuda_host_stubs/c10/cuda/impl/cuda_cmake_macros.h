/* CI stub: see ../../../cusparse.h (a CUDA build of torch generates this file). */
#pragma once
