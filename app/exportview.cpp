#include "exportview.h"

#include <QFileInfo>
#include <QPageSize>
#include <QPainter>
#include <QPdfWriter>
#include <QSaveFile>
#include <QSvgGenerator>

#include "scaling_page.h"

QString exportWidget(QWidget* page, const QString& path, const QString& title) {
  const QString ext = QFileInfo(path).suffix().toLower();
  if (ext == QLatin1String("csv")) {
    auto* scaling = qobject_cast<ScalingPage*>(page);
    if (!scaling) return QObject::tr("only the Scaling page exports .csv; use .png, .svg or .pdf here");
    QSaveFile f(path);
    const QByteArray text = scaling->csv().toUtf8();
    if (!f.open(QIODevice::WriteOnly) || f.write(text) != text.size() || !f.commit())
      return QObject::tr("could not write %1: %2").arg(path, f.errorString());
    return {};
  }
  if (ext == QLatin1String("png")) {
    QSaveFile f(path);
    if (!f.open(QIODevice::WriteOnly) || !page->grab().save(&f, "PNG") || !f.commit())
      return QObject::tr("could not write %1: %2").arg(path, f.errorString());
    return {};
  }
  if (ext == QLatin1String("svg")) {
    QSvgGenerator svg;
    svg.setFileName(path);
    svg.setSize(page->size());
    svg.setViewBox(page->rect());
    svg.setTitle(title);
    svg.setDescription(QStringLiteral("ShardScope"));
    QPainter p;
    if (!p.begin(&svg)) return QObject::tr("could not write %1").arg(path);
    page->render(&p);
    p.end();
    return {};
  }
  if (ext == QLatin1String("pdf")) {
    QPdfWriter pdf(path);
    pdf.setPageSize(QPageSize(QSizeF(page->width(), page->height()), QPageSize::Point));
    pdf.setPageMargins(QMarginsF(0, 0, 0, 0));
    pdf.setResolution(72);
    pdf.setTitle(title);
    QPainter p;
    if (!p.begin(&pdf)) return QObject::tr("could not write %1").arg(path);
    page->render(&p);
    p.end();
    return {};
  }
  return QObject::tr("export as .png, .svg or .pdf (or .csv on the Scaling page), not '%1'").arg(ext);
}
