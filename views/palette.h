// Names and colours shared by every view: memory categories in the engine's
// order, one colour each.
#pragma once

#include <QColor>

#include "protocol/events.h"

inline constexpr const auto& kCategories = ss::proto::kCategoryNames;
inline const QColor kCategoryColors[ss::proto::kCategoryCount] = {
    QColor(70, 110, 180), QColor(230, 150, 60), QColor(90, 170, 90),  QColor(150, 100, 190),
    QColor(200, 80, 80),  QColor(140, 140, 140), QColor(40, 170, 170), QColor(200, 170, 40)};
