#include "sessionspage.h"

#include <QComboBox>
#include <QFileDialog>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLabel>
#include <QLineEdit>
#include <QMenu>
#include <QPlainTextEdit>
#include <QPushButton>
#include <QTableWidget>
#include <QVBoxLayout>

#include "export.h"
#include "pages.h"
#include "sessionstore.h"

namespace {
enum Column { Name, Model, Strategy, Devices, Tokens, Backend, Date, Status, DecodeRate, Ttft, Peak, Comm, Tags, Columns };
}

SessionsPage::SessionsPage(SessionStore* store, QWidget* parent) : QWidget(parent), m_store(store) {
  auto* layout = new QVBoxLayout(this);
  m_notice = new QLabel(this);
  m_notice->setWordWrap(true);
  m_notice->setStyleSheet(QStringLiteral("QLabel { background: #fff4ce; padding: 6px; }"));
  m_notice->hide();
  layout->addWidget(m_notice);

  auto* bar = new QHBoxLayout;
  m_search = new QLineEdit(this);
  m_search->setPlaceholderText(tr("Search name, model, strategy, tags, note"));
  m_search->setClearButtonEnabled(true);
  m_status = new QComboBox(this);
  m_status->addItems({tr("any status"), "done", "running", "failed", "stopped", "oom", "interrupted"});
  bar->addWidget(m_search, 1);
  bar->addWidget(m_status);
  layout->addLayout(bar);

  m_empty = new QLabel(tr("No sessions yet. Every run is saved here as it streams (Run, or an example on the Start "
                          "page), with its setup and headline figures: open it again, replay it, or select two to four "
                          "and compare them. Import stream... adds a run recorded elsewhere with --events."),
                       this);
  m_empty->setWordWrap(true);
  m_empty->setStyleSheet(QStringLiteral("QLabel { color: #555; padding: 12px; }"));
  m_empty->hide();
  layout->addWidget(m_empty);
  m_table = new QTableWidget(0, Columns, this);
  m_table->setHorizontalHeaderLabels({tr("Name"), tr("Model"), tr("Strategy"), tr("Devices"), tr("Prompt + decode"),
                                      tr("Backend"),
                                      tr("Date"), tr("Status"), tr("Decode tok/s"), tr("TTFT ms"),
                                      tr("Peak memory"), tr("Bytes communicated"), tr("Tags")});
  m_table->setSelectionBehavior(QAbstractItemView::SelectRows);
  m_table->setSelectionMode(QAbstractItemView::ExtendedSelection);
  m_table->setEditTriggers(QAbstractItemView::DoubleClicked | QAbstractItemView::EditKeyPressed);
  m_table->setSortingEnabled(true);
  m_table->sortByColumn(Date, Qt::DescendingOrder);  // newest first
  m_table->verticalHeader()->hide();
  m_table->setWordWrap(false);
  m_table->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
  m_table->horizontalHeader()->setStretchLastSection(true);  // tags take what is left
  layout->addWidget(m_table, 1);

  auto* edit = new QHBoxLayout;
  m_tags = new QLineEdit(this);
  m_tags->setPlaceholderText(tr("tags, comma separated"));
  m_note = new QPlainTextEdit(this);
  m_note->setPlaceholderText(tr("a note on the selected session"));
  m_note->setMaximumHeight(60);
  auto* save = new QPushButton(tr("Save tags and note"), this);
  edit->addWidget(m_tags, 1);
  edit->addWidget(m_note, 2);
  edit->addWidget(save);
  layout->addLayout(edit);

  auto* actions = new QHBoxLayout;
  auto* open = new QPushButton(tr("Open"), this);
  auto* replay = new QPushButton(tr("Replay"), this);
  m_speed = new QComboBox(this);
  m_speed->addItem(QStringLiteral("1×"), 1.0);
  m_speed->addItem(QStringLiteral("10×"), 10.0);
  m_speed->addItem(tr("max"), 0.0);
  auto* compare = new QPushButton(tr("Compare selected (2–4)"), this);
  auto* del = new QPushButton(tr("Delete"), this);
  m_undo = new QPushButton(tr("Undo delete"), this);
  m_undo->hide();
  auto* import = new QPushButton(tr("Import stream..."), this);
  auto* exp = new QPushButton(tr("Export..."), this);
  for (QWidget* w : std::initializer_list<QWidget*>{open, replay, m_speed, compare, del, m_undo})
    actions->addWidget(w);
  actions->addStretch(1);
  actions->addWidget(import);
  actions->addWidget(exp);
  layout->addLayout(actions);

  connect(m_search, &QLineEdit::textChanged, this, &SessionsPage::applyFilter);
  connect(m_status, &QComboBox::currentIndexChanged, this, &SessionsPage::applyFilter);
  connect(m_table, &QTableWidget::itemSelectionChanged, this, &SessionsPage::showSelected);
  connect(m_table, &QTableWidget::cellDoubleClicked, this, [this](int row, int column) {
    if (column != Name) emit openRequested(m_table->item(row, Name)->data(Qt::UserRole).toLongLong());
  });
  connect(m_table, &QTableWidget::itemChanged, this, [this](QTableWidgetItem* item) {
    if (m_loading || item->column() != Name) return;
    if (!m_store->rename(item->data(Qt::UserRole).toLongLong(), item->text())) emit message(m_store->error());
  });
  connect(save, &QPushButton::clicked, this, [this] {
    for (qint64 id : selectedSessions())
      if (!m_store->setTags(id, m_tags->text()) || !m_store->setNote(id, m_note->toPlainText()))
        emit message(m_store->error());
    reload();
  });
  connect(open, &QPushButton::clicked, this, [this] {
    const auto ids = selectedSessions();
    if (ids.isEmpty()) emit message(tr("select a session to open"));
    else emit openRequested(ids.first());
  });
  connect(replay, &QPushButton::clicked, this, [this] {
    const auto ids = selectedSessions();
    if (ids.isEmpty()) emit message(tr("select a session to replay"));
    else emit replayRequested(ids.first(), m_speed->currentData().toDouble());
  });
  connect(compare, &QPushButton::clicked, this, [this] {
    const auto ids = selectedSessions();
    if (ids.size() < 2 || ids.size() > 4) emit message(tr("select 2 to 4 sessions to compare (%1 selected)").arg(ids.size()));
    else emit compareRequested(ids);
  });
  connect(del, &QPushButton::clicked, this, &SessionsPage::deleteSelected);
  connect(m_undo, &QPushButton::clicked, this, &SessionsPage::undoDelete);
  connect(import, &QPushButton::clicked, this, &SessionsPage::importStream);
  connect(exp, &QPushButton::clicked, this, &SessionsPage::exportMenu);
  reload();
}

void SessionsPage::setNotice(const QString& text) {
  m_notice->setText(text);
  m_notice->setVisible(!text.isEmpty());
}

void SessionsPage::reload() {
  if (!m_store) return;
  const auto keep = selectedSessions();
  m_loading = true;
  m_table->setSortingEnabled(false);
  const auto sessions = m_store->list();
  m_table->setRowCount(int(sessions.size()));
  int row = 0;
  for (const SessionInfo& s : sessions) {
    const QJsonObject h = QJsonDocument::fromJson(s.headline.toUtf8()).object();
    auto number = [&](const char* key, int decimals) {
      return h.contains(key) ? QString::number(h.value(key).toDouble(), 'f', decimals) : QString();
    };
    auto bytes = [&](const char* key) { return h.contains(key) ? bytesText(h.value(key).toDouble()) : QString(); };
    // A run that failed before its setup was recorded has no devices to count.
    const QString cells[Columns] = {s.name, s.model, s.strategy, s.model.isEmpty() ? QString() : QString::number(s.devices),
                                    s.prompt ? QStringLiteral("%1 + %2").arg(s.prompt).arg(s.decode) : QString(),
                                    s.backend,
                                    QDateTime::fromString(s.created, Qt::ISODate).toLocalTime().toString("yyyy-MM-dd hh:mm"),
                                    s.status, number("decode_tokens_per_s", 1), number("ttft_ms", 1),
                                    bytes("peak_bytes"), bytes("comm_bytes"), s.tags};
    for (int c = 0; c < Columns; ++c) {
      auto* item = new QTableWidgetItem(cells[c]);
      item->setData(Qt::UserRole, s.id);
      item->setData(Qt::UserRole + 1, s.note);
      if (c != Name || m_store->readOnly()) item->setFlags(item->flags() & ~Qt::ItemIsEditable);
      if (c == Status && s.status != QLatin1String("done"))
        item->setForeground(s.status == QLatin1String("running") ? QColor(0, 90, 180) : QColor(176, 0, 0));
      if (!s.note.isEmpty()) item->setToolTip(s.note);
      m_table->setItem(row, c, item);
    }
    ++row;
  }
  m_table->setSortingEnabled(true);
  m_loading = false;
  m_empty->setVisible(sessions.empty());
  applyFilter();
  selectSessions(keep);
}

void SessionsPage::applyFilter() {
  const QString needle = m_search->text().trimmed();
  const QString status = m_status->currentIndex() == 0 ? QString() : m_status->currentText();
  for (int r = 0; r < m_table->rowCount(); ++r) {
    bool match = needle.isEmpty();
    for (int c : {Name, Model, Strategy, Backend, Tags})
      match = match || m_table->item(r, c)->text().contains(needle, Qt::CaseInsensitive);
    match = match || m_table->item(r, Name)->data(Qt::UserRole + 1).toString().contains(needle, Qt::CaseInsensitive);
    if (!status.isEmpty()) match = match && m_table->item(r, Status)->text() == status;
    m_table->setRowHidden(r, !match);
  }
}

void SessionsPage::setFilter(const QString& text) { m_search->setText(text); }

int SessionsPage::visibleRows() const {
  int n = 0;
  for (int r = 0; r < m_table->rowCount(); ++r) n += !m_table->isRowHidden(r);
  return n;
}

QList<qint64> SessionsPage::selectedSessions() const {
  QList<qint64> ids;
  for (const QModelIndex& i : m_table->selectionModel()->selectedRows())
    ids << m_table->item(i.row(), Name)->data(Qt::UserRole).toLongLong();
  return ids;
}

void SessionsPage::selectSessions(const QList<qint64>& ids) {
  m_table->clearSelection();
  for (int r = 0; r < m_table->rowCount(); ++r)
    if (ids.contains(m_table->item(r, Name)->data(Qt::UserRole).toLongLong()))
      m_table->selectionModel()->select(m_table->model()->index(r, 0),
                                        QItemSelectionModel::Select | QItemSelectionModel::Rows);
}

void SessionsPage::showSelected() {
  const auto ids = selectedSessions();
  if (ids.size() != 1) return;
  const SessionInfo s = m_store->info(ids.first());
  m_tags->setText(s.tags);
  m_note->setPlainText(s.note);
}

void SessionsPage::deleteSelected() {
  const auto ids = selectedSessions();
  if (ids.isEmpty()) return;
  m_deleted.clear();
  for (qint64 id : ids) {
    if (!m_store->remove(id)) {
      emit message(m_store->error());
      break;
    }
    m_deleted << id;
  }
  m_undo->setText(tr("Undo delete (%1)").arg(m_deleted.size()));
  m_undo->setVisible(!m_deleted.isEmpty());
  emit message(tr("deleted %1 session(s); Undo brings them back until ShardScope is closed").arg(m_deleted.size()));
  reload();
}

void SessionsPage::undoDelete() {
  for (qint64 id : m_deleted) m_store->restore(id);
  m_deleted.clear();
  m_undo->hide();
  reload();
}

void SessionsPage::importStream() {
  const QString path = QFileDialog::getOpenFileName(this, tr("Import a recorded stream"), QString(),
                                                    tr("Event streams (*.jsonl);;All files (*)"));
  if (path.isEmpty()) return;
  const qint64 id = m_store->importStream(path);
  emit message(id ? tr("imported %1").arg(path) : m_store->error());
  reload();
  if (id) selectSessions({id});
}

void SessionsPage::exportMenu() {
  const auto ids = selectedSessions();
  if (ids.size() != 1) {
    emit message(tr("select one session to export"));
    return;
  }
  QMenu menu(this);
  const QString name = m_store->info(ids.first()).name.isEmpty() ? QStringLiteral("session")
                                                                 : m_store->info(ids.first()).name;
  QAction* stream = menu.addAction(tr("Event stream (.jsonl)"));
  QAction* trace = menu.addAction(tr("Perfetto / chrome://tracing trace (.json)"));
  QAction* csv = menu.addAction(tr("CSV tables (folder)"));
  QAction* chosen = menu.exec(QCursor::pos());
  if (!chosen) return;
  QString path;
  if (chosen == csv) path = QFileDialog::getExistingDirectory(this, tr("Folder for the CSV tables"));
  else
    path = QFileDialog::getSaveFileName(this, tr("Export"), name + (chosen == stream ? ".jsonl" : ".trace.json"));
  if (path.isEmpty()) return;
  exportSelected(chosen == stream ? "stream" : chosen == trace ? "trace" : "csv", path);
}

void SessionsPage::exportSelected(const QString& kind, const QString& path) {
  const auto ids = selectedSessions();
  if (ids.isEmpty()) return;
  QString error;
  if (kind == QLatin1String("stream")) error = writeFileAtomically(path, m_store->rawStream(ids.first()));
  else if (kind == QLatin1String("trace")) {
    const QByteArray trace = perfettoTrace(m_store->events(ids.first()));
    error = checkTrace(trace);
    if (error.isEmpty()) error = writeFileAtomically(path, trace);
    else error = tr("the trace did not pass the format check (%1); nothing written").arg(error);
  } else {
    error = exportCsv(m_store->events(ids.first()), path);
  }
  emit message(error.isEmpty() ? tr("exported to %1").arg(path) : error);
}
