// Writes a page to a file chosen by its extension: PNG (a grab), SVG and PDF
// (vector, rendered), and CSV for pages whose data is a table (the Scaling
// page's points). Returns an empty string, or one line saying what failed.
#pragma once

#include <QString>

class QWidget;

QString exportWidget(QWidget* page, const QString& path, const QString& title);
