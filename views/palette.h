// Names and colours shared by every view: memory categories in the engine's
// order, one colour each.
#pragma once

#include <QColor>

inline const char* const kCategories[] = {"weights",   "activations",  "kv_cache",
                                          "ssm_state", "comm_buffers", "workspace"};
inline const QColor kCategoryColors[] = {QColor(70, 110, 180), QColor(230, 150, 60), QColor(90, 170, 90),
                                         QColor(150, 100, 190), QColor(200, 80, 80), QColor(140, 140, 140)};
