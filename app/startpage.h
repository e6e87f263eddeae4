// The first screen: what ShardScope shows, in a few lines, and ready
// examples one click each. And PageNotice: the explanation a page shows over
// itself while it has nothing to draw.
#pragma once

#include <QLabel>
#include <QWidget>

#include <functional>
#include <vector>

class RunData;

enum class Example {
  TpVsTspLongContext,  // llama2-7b at 32K tokens on a simulated 8 x MI300X node, tp then tsp, side by side
  Int8TextModel,       // brown-llama answering a prompt with int8 and int4 all-reduces beside fp32
  TrainTsp,            // brown-llama training steps under tsp on 4 CPU ranks
};

class StartPage : public QWidget {
  Q_OBJECT
 public:
  explicit StartPage(QWidget* parent = nullptr);

 signals:
  void exampleChosen(Example e);
};

// A label laid over `page` (following its size) that says what the page will
// show and how to get there; shown while `empty(data)` holds.
class PageNotice : public QLabel {
  Q_OBJECT
 public:
  PageNotice(QWidget* page, const QString& text, std::function<bool(const RunData&)> empty);
  void refresh(const RunData& data);

 protected:
  bool eventFilter(QObject* watched, QEvent* event) override;

 private:
  std::function<bool(const RunData&)> m_empty;
};
