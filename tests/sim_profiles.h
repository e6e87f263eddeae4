// Hardware profiles in the simulator suites: the repository's profiles, and
// `simulate` on an edited copy of one.
#pragma once

#include <QFile>
#include <QFileInfo>
#include <QString>
#include <QStringList>
#include <QTemporaryDir>

#include <nlohmann/json.hpp>

#include "engine_process.h"

inline QString resources_dir() {
  return qEnvironmentVariable("SHARDSCOPE_RESOURCES", SHARDSCOPE_TESTS_DIR "/../resources");
}

inline nlohmann::json read_json(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return nlohmann::json();
  return nlohmann::json::parse(f.readAll().toStdString(), nullptr, false);
}

// The engine binary is there, and `h100` holds resources/hardware/h100-sxm.json
// (the profile the suites edit); a warning names what is missing.
inline bool sim_suite_ready(nlohmann::json& h100) {
  if (!QFileInfo::exists(SHARDSCOPE_ENGINE_BIN)) {
    qWarning("the engine binary %s does not exist", SHARDSCOPE_ENGINE_BIN);
    return false;
  }
  h100 = read_json(resources_dir() + "/hardware/h100-sxm.json");
  if (!h100.is_object()) qWarning("resources/hardware/h100-sxm.json is not readable");
  return h100.is_object();
}

// `simulate --hardware` a copy of `profile` written as `name` in `dir`, with
// `args`; a run that exits 3 when the file cannot be written.
inline Ran simulate_with(const QTemporaryDir& dir, const QString& name, const nlohmann::json& profile,
                         const QStringList& args) {
  const QString file = dir.filePath(name);
  QFile f(file);
  if (!f.open(QIODevice::WriteOnly) || f.write(QByteArray::fromStdString(profile.dump(2))) < 0) {
    Ran failed;
    failed.exit_code = 3;
    failed.err = "cannot write " + file.toUtf8();
    return failed;
  }
  f.close();
  return engine(QStringList{"simulate", "--hardware", file} + args);
}
