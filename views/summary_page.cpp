#include "pages.h"

#include <QSysInfo>
#include <QTextBrowser>
#include <QTextCursor>
#include <QTextFrame>
#include <QTextTable>
#include <QThread>
#include <QVBoxLayout>
#include <qcustomplot.h>

#include <algorithm>
#include <map>
#include <optional>
#include <cmath>

#include "palette.h"
#include "training.h"
#include "protocol/analysis.h"

// --------------------------------------------------------------- Summary ---

namespace {

// The prompt and the run's answer as text (ids where the model has no
// tokenizer), the answer growing as the engine streams it.
QString answerHtml(const RunData& data) {
  const ss::proto::Generation* answer = nullptr;
  for (const auto& g : data.generations())
    if (g.config.empty()) answer = &g;
  QString h;
  const auto ids = [](const std::vector<int64_t>& v) {
    QStringList s;
    for (int64_t id : v) s << QString::number(id);
    return s.join(' ');
  };
  if (const auto& p = data.prompt())
    h += QObject::tr("<p><b>Prompt</b> (%1 tokens): %2</p>")
             .arg(p->ids.size())
             .arg(QString::fromStdString(p->text).toHtmlEscaped().replace('\n', "<br>"));
  if (answer) {
    const QString body = answer->text ? QString::fromStdString(*answer->text).toHtmlEscaped().replace('\n', "<br>")
                                      : QObject::tr("token ids %1").arg(ids(answer->tokens));
    h += QObject::tr("<p><b>Answer</b> (%1 tokens%2): %3</p>")
             .arg(answer->tokens.size())
             .arg(answer->partial ? QObject::tr(", still coming") : QString())
             .arg(body);
  }
  return h;
}

// verify's page: a run against the same run on one cpu device, row by row
// (engine/runtime/verify.h).
QString verifyHtml(const RunData& data) {
  const nlohmann::json& c = data.config();
  const nlohmann::json& v = c["verify"];
  const auto work = c.value("workload", nlohmann::json::object());
  const int64_t P = work.value("prompt_len", int64_t(0)), decode = work.value("decode", int64_t(0));
  const bool batch = work.value("batch", 1) > 1;
  const auto text = [&](const char* k) { return QString::fromStdString(v.value(k, std::string("?"))).toHtmlEscaped(); };
  QString h = QObject::tr("<h3>%1 against %2</h3>").arg(text("run"), text("reference"));
  h += QObject::tr("<p>%1, %2; %3 tokens%4. Both runs read the same weights and tokens; decode is fed one device's "
                   "greedy tokens in both, so every row is compared in the same context.</p>")
           .arg(QString::fromStdString(c.value("model", nlohmann::json::object()).value("name", std::string("?"))))
           .arg(QString::fromStdString(c.value("dtype", std::string("fp32"))))
           .arg(P)
           .arg(decode ? QObject::tr(", %1 decode steps").arg(decode) : QString());
  const auto place = [&](double row) {
    return QString::fromStdString(ss::proto::row_place(int64_t(row), P, decode, batch, false));
  };
  const auto accuracy = [&](const std::string& metric, const std::string& site) -> std::optional<double> {
    for (const auto& a : data.accuracy())
      if (a.metric == metric && a.site == site && a.config.empty()) return a.value;
    return std::nullopt;
  };
  const auto metric = [&](const std::string& name) {
    const auto it = data.metrics().find(name);
    return it == data.metrics().end() ? 0.0 : it->second;
  };
  const double bound = v.value("bound", 0.0);
  double worst = 0;
  for (const auto& a : data.accuracy())
    if (a.metric == "rel_l2" && a.config.empty()) worst = std::max(worst, a.value);
  if (data.status() == QLatin1String("ok"))
    h += QObject::tr("<p style='color:#1a7f37'><b>It computes what one device computes</b>: its rows are at most "
                     "%1 from one device's (relative L2), within the bound of %2 for %3 over %4 layers.</p>")
             .arg(worst, 0, 'g', 3)
             .arg(bound, 0, 'g', 3)
             .arg(QString::fromStdString(c.value("dtype", std::string("fp32"))))
             .arg(v.value("layers", 0));
  else if (data.status().isEmpty())
    h += QObject::tr("<p>Running: %1 of the two runs done.</p>")
             .arg(data.metrics().count("verify_seconds.run") ? 2 : data.metrics().count("verify_seconds.reference"));
  h += QObject::tr("<table cellpadding=3><tr><th></th><th>rows</th><th>worst row, relative L2</th><th>at</th>"
                   "<th>largest difference</th></tr>");
  for (const char* phase : {"prefill", "decode"}) {
    const auto worst = accuracy("rel_l2", phase);
    if (!worst) continue;
    h += QStringLiteral("<tr><td>%1</td><td align=right>%2</td><td align=right>%3</td><td>%4</td>"
                        "<td align=right>%5</td></tr>")
             .arg(phase)
             .arg(metric(std::string("verify_rows.") + phase))
             .arg(*worst, 0, 'g', 3)
             .arg(place(metric(std::string("verify_worst_row.") + phase)))
             .arg(accuracy("max_abs_diff", phase).value_or(0), 0, 'g', 3);
  }
  h += QStringLiteral("</table>");
  if (const auto top1 = accuracy("top1", ""))
    h += QObject::tr("<p>Top-1 token: the same in %1% of rows.</p>").arg(100 * *top1, 0, 'f', 1);
  h += QObject::tr("<p><small>The bound: a strategy rounds at other points than one device does (a partial sum "
                   "before it is reduced, a shard's K/V or state after) and sums in another order. The strategy "
                   "tests hold every strategy to 1e-5 in fp32 and 8 unit roundoffs in bf16 or fp16 through four "
                   "layers; deeper, it grows as the square root of the depth. A sharding error (a wrong shard, a "
                   "lost partial sum) moves logits by far more.</small></p>");
  return h;
}

// train --verify's page: a training step against the same step on one cpu
// device, tensor by tensor (engine/runtime/verify.h).
QString trainVerifyHtml(const RunData& data) {
  const nlohmann::json& c = data.config();
  const nlohmann::json& v = c["verify"];
  const auto work = c.value("workload", nlohmann::json::object());
  const QString dtype = QString::fromStdString(c.value("dtype", std::string("fp32")));
  const bool rounded = v.contains("exact");
  const double bound = v.value("bound", 0.0), factor = v.value("factor", 0.0), loss_bound = v.value("loss_bound", 0.0);
  const auto text = [&](const char* k) { return QString::fromStdString(v.value(k, std::string("?"))).toHtmlEscaped(); };
  const int64_t sequences = work.value("sequences", int64_t(1)), steps = work.value("steps", int64_t(1));
  QString h = QObject::tr("<h3>%1 trains against %2</h3>").arg(text("run"), text("reference"));
  h += QObject::tr("<p>%1, %2; %3 of %4 tokens a step, %5. Both start from the same weights and read the same "
                   "sequences (one device reads in one micro-batch what the replicas read together); each keeps "
                   "its first step's whole gradient.%6</p>")
           .arg(QString::fromStdString(c.value("model", nlohmann::json::object()).value("name", std::string("?"))))
           .arg(dtype)
           .arg(sequences == 1 ? QObject::tr("1 sequence") : QObject::tr("%1 sequences").arg(sequences))
           .arg(work.value("seq_len", int64_t(0)))
           .arg(steps == 1 ? QObject::tr("1 step") : QObject::tr("%1 steps").arg(steps))
           .arg(rounded ? QObject::tr(" A third run, %1, gives the exact gradient both %2 gradients are measured "
                                      "from.")
                              .arg(text("exact"), dtype)
                        : QString());
  // Each tensor: the run's distance, and one device's where it was measured.
  std::map<std::string, double> run, one;
  std::optional<double> loss, norm, curve;
  for (const auto& a : data.accuracy()) {
    if (a.metric == "grad_rel_l2") (a.config.empty() ? run : one)[a.site] = a.value;
    if (!a.config.empty()) continue;
    if (a.metric == "rel_l2" && a.site == "loss") loss = a.value;
    if (a.metric == "rel_l2" && a.site == "grad_norm") norm = a.value;
    if (a.metric == "max_abs_diff" && a.site == "loss_curve") curve = a.value;
  }
  const auto metric = [&](const char* name) {
    const auto it = data.metrics().find(name);
    return it == data.metrics().end() ? 0.0 : it->second;
  };
  // A figure, red where it is past its bound.
  const auto figure = [](double value, double allowed) {
    const QString f = QString::number(value, 'g', 3);
    return value > allowed ? QStringLiteral("<span style='color:#cf222e'>%1</span>").arg(f) : f;
  };
  // Step 1, or the step after the one a resumed run starts from.
  const qint64 first = data.metrics().count("verify_first_step") ? qint64(metric("verify_first_step")) : 1;
  if (data.status() == QLatin1String("ok"))
    h += QObject::tr("<p style='color:#1a7f37'><b>It trains as one device does</b>: step %2's loss, gradient norm "
                     "and all %1 gradient tensors are within their bounds.</p>")
             .arg(metric("verify_tensors"))
             .arg(first);
  else if (data.status().isEmpty())
    h += QObject::tr("<p>Running: %1 of the %2 runs done.</p>")
             .arg(int(data.metrics().count("verify_seconds.reference") + data.metrics().count("verify_seconds.exact") +
                      data.metrics().count("verify_seconds.run")))
             .arg(rounded ? 3 : 2);
  if (loss && norm)
    h += QObject::tr("<p>Step %4: the loss is %1 from one device's, the gradient norm %2 (relative; bound %3).</p>")
             .arg(figure(*loss, loss_bound), figure(*norm, loss_bound))
             .arg(loss_bound, 0, 'g', 3)
             .arg(first);
  if (!run.empty()) {
    // The tensors nearest their bound first (in bf16 a tensor's bound is its own).
    auto allowed = [&](const std::string& name) { return ss::proto::train_verify_tensor_bound(v, one[name]); };
    std::vector<std::string> names;
    for (auto& [name, e] : run)
      if (name != "whole") names.push_back(name);
    std::sort(names.begin(), names.end(),
              [&](const std::string& a, const std::string& b) { return run[a] / allowed(a) > run[b] / allowed(b); });
    h += QObject::tr("<p>Step %6's gradient: %1 relative L2 over the whole from %2%3; %4 of %5 tensors past "
                     "their bound. Nearest their bound:</p>")
             .arg(run["whole"], 0, 'g', 3)
             .arg(rounded ? QObject::tr("the exact (fp32) gradient") : QObject::tr("one device's"))
             .arg(rounded ? QObject::tr(" (one %1 device's: %2)").arg(dtype).arg(one["whole"], 0, 'g', 3) : QString())
             .arg(metric("verify_tensors_past"))
             .arg(names.size())
             .arg(first);
    h += QObject::tr("<table cellpadding=3><tr><th align=left>tensor</th><th>relative L2</th>%1<th>bound</th></tr>")
             .arg(rounded ? QObject::tr("<th>one %1 device's</th>").arg(dtype) : QString());
    for (size_t i = 0; i < std::min<size_t>(names.size(), 8); ++i) {
      const std::string& n = names[i];
      h += QStringLiteral("<tr><td>%1</td><td align=right>%2</td>%3<td align=right>%4</td></tr>")
               .arg(QString::fromStdString(n).toHtmlEscaped())
               .arg(figure(run[n], allowed(n)))
               .arg(rounded ? QStringLiteral("<td align=right>%1</td>").arg(one[n], 0, 'g', 3) : QString())
               .arg(allowed(n), 0, 'g', 3);
    }
    h += QStringLiteral("</table>");
  }
  if (curve)
    h += QObject::tr("<p>Steps %3 to %1: the losses differ by at most %2 nats. Not bounded: AdamW moves a weight by "
                     "about the learning rate whatever its gradient's size, so a gradient within rounding of zero "
                     "moves it either way, and two runs part by chance.</p>")
             .arg(first + steps - 1)
             .arg(*curve, 0, 'g', 3)
             .arg(first);
  h += rounded ? QObject::tr("<p><small>The bounds: in %1 a gradient that sums many terms which cancel (A_log's, "
                             "D's, a norm's weight) is far from the exact one on any device, so each tensor may be "
                             "at most %2 times as far from the exact gradient as one %1 device's is (two runs' "
                             "roundings differ by chance, most over tensors of a few values), plus %3. In fp32 "
                             "each tensor is held to the strategy tests' 1e-5 (growing as the square root of the "
                             "depth past four layers).</small></p>")
                     .arg(dtype)
                     .arg(factor)
                     .arg(bound, 0, 'g', 3)
               : QObject::tr("<p><small>The bound: the strategy tests hold every strategy's gradient to 1e-5 "
                             "(relative L2, per tensor) through four layers; deeper, it grows as the square root of "
                             "the depth. A sharding error (a lost partial sum, a gradient not reduced) moves a "
                             "tensor's gradient by far more.</small></p>");
  return h;
}

}  // namespace

SummaryPage::SummaryPage(const RunData& data, QWidget* parent) : QWidget(parent), m_data(data) {
  auto* layout = new QVBoxLayout(this);
  m_text = new QTextBrowser(this);
  layout->addWidget(m_text);
}

// The page as plain text: paragraphs as lines, tables as aligned columns
// (for --run-once and the headless demo; QTextDocument would put each cell
// on a line of its own).
QString SummaryPage::text() const {
  QString out;
  QTextFrame* root = m_text->document()->rootFrame();
  for (auto it = root->begin(); !it.atEnd(); ++it) {
    if (auto* table = qobject_cast<QTextTable*>(it.currentFrame())) {
      std::vector<QStringList> rows;
      std::vector<int> width(size_t(table->columns()), 0);
      for (int r = 0; r < table->rows(); ++r) {
        QStringList row;
        for (int c = 0; c < table->columns(); ++c) {
          const QTextTableCell cell = table->cellAt(r, c);
          QTextCursor cur = cell.firstCursorPosition();
          cur.setPosition(cell.lastCursorPosition().position(), QTextCursor::KeepAnchor);
          row << cur.selectedText().replace(QChar::ParagraphSeparator, ' ').simplified();
          width[size_t(c)] = std::max(width[size_t(c)], int(row.back().size()));
        }
        rows.push_back(row);
      }
      for (const QStringList& row : rows) {
        QString line;
        for (int c = 0; c < row.size(); ++c) line += row[c].leftJustified(width[size_t(c)] + 2);
        while (line.endsWith(' ')) line.chop(1);
        out += QStringLiteral("  ") + line + '\n';
      }
    } else if (it.currentBlock().isValid() && !it.currentBlock().text().trimmed().isEmpty()) {
      out += it.currentBlock().text() + '\n';
    }
  }
  return out;
}

namespace {
// What a scaling sweep covers, from its config (as the engine writes it;
// anything else is left out): its strategies, mode, devices and lengths.
QString scaleSweepText(const nlohmann::json& c) {
  const nlohmann::json& sc = c["scale"].is_object() ? c["scale"] : nlohmann::json::object();
  QStringList strategies;
  double shortest = 0, longest = 0;
  if (sc.contains("strategies") && sc["strategies"].is_array())
    for (const auto& st : sc["strategies"])
      if (st.is_string()) strategies << QString::fromStdString(st.get<std::string>()).replace(':', ' ').toHtmlEscaped();
  if (sc.contains("seq_lens") && sc["seq_lens"].is_array())
    for (const auto& n : sc["seq_lens"])
      if (n.is_number() && n.get<double>() > 0) {
        shortest = shortest > 0 ? std::min(shortest, n.get<double>()) : n.get<double>();
        longest = std::max(longest, n.get<double>());
      }
  const bool training = !(sc.contains("mode") && sc["mode"] == "infer");
  const int devices = c.contains("devices") && c["devices"].is_number_integer() ? c["devices"].get<int>() : 0;
  QString what = QObject::tr("%1 %2").arg(strategies.isEmpty() ? QObject::tr("Every strategy") : strategies.join(", "),
                                          training ? QObject::tr("training") : QObject::tr("inference"));
  if (devices > 0) what += QObject::tr(" on %1 simulated devices").arg(devices);
  if (longest > 0)
    what += QObject::tr(", at %1 tokens")
                .arg(shortest == longest ? lengthText(longest)
                                         : QObject::tr("%1 to %2").arg(lengthText(shortest), lengthText(longest)));
  return what + QObject::tr(": the Scaling page draws each one's peak memory, time and traffic against length.");
}
}  // namespace

void SummaryPage::setNotice(const QString& notice) {
  m_notice = notice;
  m_seen = ~0ull;  // redraw with it
  refresh();
}

void SummaryPage::refresh() {
  if (m_seen == m_data.revision()) return;
  m_seen = m_data.revision();
  const auto& c = m_data.config();
  const auto model = c.value("model", nlohmann::json::object());
  QString h;
  if (!m_notice.isEmpty())
    h += QStringLiteral("<p style='color:#b00'><b>%1</b></p>").arg(m_notice.toHtmlEscaped().replace('\n', "<br>"));
  if (c.empty()) {  // nothing arrived from the engine (refused, or failed before its config)
    m_text->setHtml(h);
    return;
  }
  // The stream's errors, one paragraph each.
  const auto errorsHtml = [&] {
    QString e;
    for (const auto& err : m_data.errors())
      e += QStringLiteral("<p style='color:#b00'>%1</p>").arg(QString::fromStdString(err.message).toHtmlEscaped());
    return e;
  };
  // Sweeps run no devices of their own to summarize: their pages draw them.
  if (c.contains("scale") || c.contains("sweep")) {
    const bool scale = c.contains("scale");
    h += tr("<h3>%1 · %2</h3><p>%3</p>")
             .arg(scale ? tr("Scaling sweep") : tr("Quantization sweep"))
             .arg(QString::fromStdString(model.value("name", std::string("?"))).toHtmlEscaped())
             .arg(scale ? scaleSweepText(c)
                        : tr("The setup run with each quantized all-reduce against the unquantized one: the "
                             "Quantization page sets their wire bytes against their accuracy, token by token."));
    m_text->setHtml(h + errorsHtml());
    return;
  }
  if (c.contains("verify") && c["verify"].is_object()) {
    const bool train = c["verify"].value("train", false);
    m_text->setHtml(h + (train ? trainVerifyHtml(m_data) : verifyHtml(m_data)) + errorsHtml());
    return;
  }
  // The run's number formats (streams from before they existed are fp32).
  const QString dtype = QString::fromStdString(c.value("dtype", std::string("fp32")));
  const QString kvDtype = QString::fromStdString(c.value("kv_dtype", dtype.toStdString()));
  auto bytesPer = [](const QString& d) { return d == QLatin1String("fp32") ? 4.0 : 2.0; };
  const double bpv = bytesPer(dtype), kvBytes = bytesPer(kvDtype);
  const double residualBytes = model.value("residual_in_fp32", false) ? 4.0 : bpv;
  // A cuda run names its GPU.
  std::string backend = c.value("backend", std::string("?"));
  if (c.contains("gpu") && c["gpu"].is_object() && c["gpu"].contains("name"))
    backend += " (" + c["gpu"].value("name", std::string()) + ")";
  h += tr("<h3>%1 · %2 · %3 device(s) · %4 · %5</h3>")
                  .arg(QString::fromStdString(model.value("name", "?")),
                       QString::fromStdString(ss::proto::strategy_label(c)).toHtmlEscaped())
                  .arg(c.value("devices", 1))
                  .arg(QString::fromStdString(backend).toHtmlEscaped())
                  .arg(kvDtype == dtype ? dtype : tr("%1, KV cache %2").arg(dtype, kvDtype));
  // More CPU ranks than this machine's cores: every rank waits for a core,
  // so times (not memory, not bytes) say little about the strategy.
  if (c.value("backend", std::string()) == "cpu" && !m_data.ranks().empty()) {
    const int cores = QThread::idealThreadCount();
    const int ranksHere = int(m_data.ranks().size());
    const std::string host = m_data.ranks().begin()->second.device.host;
    if (ranksHere > cores && (host.empty() || QString::fromStdString(host) == QSysInfo::machineHostName()))
      h += tr("<p style='color:#8a5a00'>%1 ranks shared %2 cores here, so times are stretched and speed comparisons "
              "between strategies are unreliable; memory and bytes are exact. For times on real hardware, use a "
              "simulated backend.</p>")
               .arg(ranksHere)
               .arg(cores);
  }
  // GPUs shared by ranks (or no NCCL): the kernels are the GPU's, the
  // collectives MPI's through host memory, so communication times are not NCCL's.
  if (c.value("backend", std::string()) == "cuda" && c.contains("gpu") && c["gpu"].is_object()) {
    const std::string collectives = c["gpu"].value("collectives", std::string("nccl"));
    if (collectives != "nccl")
      h += tr("<p style='color:#8a5a00'>Collectives: %1. Every kernel ran on the GPU and the results are exact, but "
              "communication times are MPI's through host memory, not NCCL's.</p>")
               .arg(QString::fromStdString(collectives).toHtmlEscaped());
  }
  h += answerHtml(m_data);
  auto metric = [&](const char* name, const QString& label, const QString& unit, double scale = 1) {
    auto it = m_data.metrics().find(name);
    if (it != m_data.metrics().end())
      h += QStringLiteral("<tr><td>%1</td><td align=right>%2 %3</td></tr>").arg(label).arg(it->second * scale, 0, 'f', 2).arg(unit);
  };
  h += QStringLiteral("<table cellpadding=3>");
  metric("ttft_ms", tr("time to first token"), tr("ms"));
  metric("prefill_tokens_per_s", tr("prefill"), tr("tokens/s"));
  metric("decode_tokens_per_s", tr("decode"), tr("tokens/s"));
  metric("decode_ms_per_token", tr("per decoded token"), tr("ms"));
  h += QStringLiteral("</table><h4>%1</h4><table cellpadding=3><tr><th>rank</th>").arg(tr("Peak memory per device"));
  for (const char* cat : kCategories) h += QStringLiteral("<th>%1</th>").arg(cat);
  h += QStringLiteral("<th>total</th></tr>");
  for (auto& [r, d] : m_data.ranks()) {
    h += QStringLiteral("<tr><td>%1</td>").arg(r);
    for (const char* cat : kCategories) {
      auto it = d.metrics.find(std::string("peak_") + cat + "_bytes");
      h += QStringLiteral("<td align=right>%1</td>").arg(it == d.metrics.end() ? QStringLiteral("–") : bytesText(it->second));
    }
    auto it = d.metrics.find("peak_bytes");
    h += QStringLiteral("<td align=right><b>%1</b></td></tr>").arg(it == d.metrics.end() ? QStringLiteral("–") : bytesText(it->second));
  }
  h += tr("</table><p><small>Each category's column is its own peak; the total is the highest the categories "
          "reached together, so it can be less than their sum.</small></p>");
  if (isTraining(m_data)) h += trainingSummaryHtml(m_data);
  // For teaching: what the strategy does, and the textbook expectation beside
  // what rank 0 measured.
  const QString strategy = QString::fromStdString(c.value("strategy", "single"));
  static const std::map<QString, QString> kExplain = {
      {"single", QObject::tr("One device holds every weight and every token: the reference every strategy must equal.")},
      {"dp", QObject::tr("Every device holds all weights and runs its own sequences; devices never talk during inference.")},
      {"tp", QObject::tr("Tensor parallelism: each device holds 1/T of every attention head group, MLP column block or "
                         "Mamba channel block and sees every token; one all-reduce after attention and one after the "
                         "MLP (Mamba: after out_proj, plus the small x_proj one).")},
      {"sp", QObject::tr("Sequence parallelism: every device holds all weights and 1/S of the tokens (zigzag chunks "
                         "balance causal work); attention all-gathers K/V, Mamba layers pass a conv halo and scan "
                         "states between devices.")},
      {"tp_sp", QObject::tr("A T x S mesh: tensor parallelism along T, sequence parallelism along S.")},
      {"tsp", QObject::tr("Folded tensor and sequence parallelism: each device holds 1/D of every projection AND 1/D of "
                          "the tokens; weight shards are broadcast in turns (attention) or passed around a ring (MLP, "
                          "Mamba) while each device computes its own tokens, so no all-reduce is needed.")}};
  if (auto it = kExplain.find(strategy); it != kExplain.end()) h += QStringLiteral("<p><i>%1</i></p>").arg(it->second);
  const auto mesh = c.value("mesh", nlohmann::json::object());
  const double D = c.value("devices", 1), T = mesh.value("tp", 1), S = mesh.value("sp", 1);
  const double shards = strategy == "tsp" ? D : (strategy == "tp" || strategy == "tp_sp") ? T : 1;
  const double params = c.value("parameters", 0.0);
  if (params > 0 && !m_data.ranks().empty() && !isTraining(m_data)) {  // inference's textbook terms
    const auto& r0 = m_data.ranks().begin()->second.metrics;
    auto measured = [&](const char* k) { auto it = r0.find(k); return it == r0.end() ? 0.0 : it->second; };
    h += tr("<h4>Expected (textbook) against measured, rank 0</h4><table cellpadding=3>"
            "<tr><th></th><th>expected</th><th>measured</th><th>note</th></tr>");
    // Embeddings and the LM head stay whole on every device.
    const double embed = model.value("vocab_size", 0.0) * model.value("hidden_size", 0.0) *
                         (model.value("tie_word_embeddings", false) ? 1 : 2);
    h += tr("<tr><td>weights</td><td align=right>%1</td><td align=right>%2</td><td>(parameters - embeddings and "
            "head) x %4 bytes / (shards = %3) + embeddings and head x %4 bytes (norms, also whole, are left "
            "out)</td></tr>")
             .arg(bytesText((params - embed) * bpv / shards + embed * bpv))
             .arg(bytesText(measured("peak_weights_bytes")))
             .arg(shards)
             .arg(bpv);
    const auto work = c.value("workload", nlohmann::json::object());
    const double tokens = work.value("prompt_len", 0.0) + work.value("decode", 0.0);
    const double layers = model.value("num_hidden_layers", 0.0);
    const double kv = model.value("num_key_value_heads", 0.0) * model.value("head_dim", 0.0);
    int attn_layers = 0;
    for (char l : model.value("layer_pattern", std::string())) attn_layers += l == 'A';
    if (kv > 0 && layers > 0) {
      const double seq = strategy == "tsp" ? D : S, heads_split = (strategy == "tsp") ? 1 : shards;
      h += tr("<tr><td>KV cache</td><td align=right>%1</td><td align=right>%2</td><td>2 (K, V) x %3 attention "
              "layers x tokens / (sequence shards = %4) x kv width / (head shards = %5) x %6 bytes</td></tr>")
               .arg(bytesText(2 * attn_layers * tokens / seq * kv / heads_split * kvBytes))
               .arg(bytesText(measured("peak_kv_cache_bytes")))
               .arg(attn_layers)
               .arg(seq)
               .arg(heads_split)
               .arg(kvBytes);
    }
    // Activations: the residual stream of the tokens this device works on is
    // the least any layer keeps live; the measured peak adds the layer's own
    // intermediates (projections, the MLP's hidden width, attention tiles).
    {
      const double tokensHere = strategy == "tsp" ? work.value("prompt_len", 0.0) / D
                                : (strategy == "sp" || strategy == "tp_sp") ? work.value("prompt_len", 0.0) / S
                                                                             : work.value("prompt_len", 0.0);
      const double dm = model.value("hidden_size", 0.0);
      if (tokensHere > 0 && dm > 0)
        h += tr("<tr><td>activations</td><td align=right>&ge; %1</td><td align=right>%2</td><td>the residual "
                "stream: tokens on this device (%3) x d x %4 bytes; the peak adds one layer's intermediates</td></tr>")
                 .arg(bytesText(tokensHere * dm * residualBytes))
                 .arg(bytesText(measured("peak_activations_bytes")))
                 .arg(tokensHere)
                 .arg(residualBytes);
    }
    // Bytes one device puts on the wire for one attention layer's prefill,
    // counted as the engine counts them: an all-reduce of N bytes moves
    // 2(n-1)/n N (ring), an all-gather (n-1)/n N, a ring step or broadcast
    // turn the shard itself.
    const double d = model.value("hidden_size", 0.0), inter = model.value("intermediate_size", 0.0);
    const double batch = strategy == "dp" ? 1 : work.value("batch", 1.0);
    const double P = work.value("prompt_len", 0.0) * batch;
    const std::string precision = c.value("comm_precision", std::string("fp32"));
    int first_attn = -1;
    {
      const std::string pattern = model.value("layer_pattern", std::string());
      for (size_t i = 0; i < pattern.size(); ++i)
        if (pattern[i] == 'A') {
          first_attn = int(i);
          break;
        }
    }
    if (first_attn >= 0 && kv > 0 && d > 0 && P > 0 && precision == "fp32") {
      double expected = 0;
      QString how;
      // Partial sums and weight shards travel in the compute dtype, K/V in the cache's.
      if (strategy == "tp") {
        expected = 2 * 2 * (T - 1) / T * P * d * bpv;
        how = tr("2 all-reduces (attention, MLP) x 2(T-1)/T x tokens x d x %1 bytes").arg(bpv);
      } else if (strategy == "sp") {
        expected = 2 * (S - 1) / S * P * kv * kvBytes;
        how = tr("K and V all-gathered: 2 x (S-1)/S x tokens x kv width x %1 bytes").arg(kvBytes);
      } else if (strategy == "tp_sp") {
        expected = 2 * 2 * (T - 1) / T * (P / S) * d * bpv + 2 * (S - 1) / S * P * (kv / T) * kvBytes;
        how = tr("2 all-reduces of tokens/S rows along T, plus K and V (kv width/T) all-gathered along S");
      } else if (strategy == "tsp") {
        const double qkv = d * (d + 2 * kv), o = d * d, mlp = 3 * d * inter;
        expected = (qkv + o) * bpv + 2 * (D - 1) / D * P * kv * kvBytes + (D - 1) / D * mlp * bpv;
        how = tr("attention weights broadcast in D turns of 1/D each, K and V all-gathered, MLP weights passed "
                 "D-1 steps around the ring");
      } else {
        how = tr("nothing: every device works alone");
      }
      double measuredBytes = 0;
      for (const auto& sp : m_data.ranks().begin()->second.spans)
        if (sp.stream == "comm" && sp.layer == first_attn && sp.phase == "prefill") measuredBytes += sp.bytes;
      h += tr("<tr><td>bytes sent, attention layer %1, prefill</td><td align=right>%2</td><td "
              "align=right>%3</td><td>%4</td></tr>")
               .arg(first_attn)
               .arg(bytesText(expected))
               .arg(bytesText(measuredBytes))
               .arg(how);
    }
    h += QStringLiteral("</table>");
  }
  // Communication, once the run has ended.
  if (!m_data.status().isEmpty()) {
    double bytes = 0, commNs = 0, hiddenNs = 0;
    for (auto& [rank, st] : m_data.commStats()) {
      bytes += st.bytes;
      commNs += st.commNs;
      hiddenNs += st.hiddenNs;
    }
    h += tr("<h4>Communication</h4><p>%1 on the wire in all; %2% of communication time hidden behind compute.</p>")
             .arg(bytesText(bytes))
             .arg(commNs > 0 ? 100 * hiddenNs / commNs : 0.0, 0, 'f', 0);
  }
  for (const auto& e : m_data.errors())
    h += tr("<p style='color:#b00'><b>%1</b> (rank %2): %3</p>")
             .arg(QString::fromStdString(e.code))
             .arg(e.rank)
             .arg(QString::fromStdString(e.message).toHtmlEscaped());
  m_text->setHtml(h);
}
