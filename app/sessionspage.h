// The session browser: every saved run with its setup, status and headline
// figures; search and filter; rename in place, tags and a note; delete with
// undo; open, replay (1x, 10x, max), compare 2-4, import and export.
#pragma once

#include <QWidget>

class QComboBox;
class QLabel;
class QLineEdit;
class QPlainTextEdit;
class QPushButton;
class QTableWidget;
class SessionStore;

class SessionsPage : public QWidget {
  Q_OBJECT
 public:
  SessionsPage(SessionStore* store, QWidget* parent = nullptr);
  void reload();
  // A banner above the list (read-only database, saving stopped, ...).
  void setNotice(const QString& text);
  QList<qint64> selectedSessions() const;
  void selectSessions(const QList<qint64>& ids);
  int visibleRows() const;
  QTableWidget* table() { return m_table; }
  void setFilter(const QString& text);
  // Deletes the selected sessions (undo brings them back until the next open).
  void deleteSelected();
  void undoDelete();
  void exportSelected(const QString& kind, const QString& path);

 signals:
  void openRequested(qint64 session);
  void replayRequested(qint64 session, double speed);  // speed 0: as fast as possible
  void compareRequested(const QList<qint64>& sessions);
  void message(const QString& text);

 private:
  void applyFilter();
  void showSelected();
  void importStream();
  void exportMenu();
  SessionStore* m_store;
  QLineEdit* m_search;
  QComboBox* m_status;
  QTableWidget* m_table;
  QLabel* m_notice;
  QLabel* m_empty;  // what the page will hold, while it holds nothing
  QLineEdit* m_tags;
  QPlainTextEdit* m_note;
  QPushButton* m_undo;
  QComboBox* m_speed;
  QList<qint64> m_deleted;
  bool m_loading = false;
};
