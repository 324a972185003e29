#include "text/chat_template.h"

#include "dory/error.h"

namespace dory {

namespace {

template <class J>
jinja::Value to_value(const J& j, int depth = 0) {
  using jinja::Value;
  if (depth > jinja::kMaxNesting)
    throw Error("chat template context: JSON nests more than 512 levels deep");
  switch (j.type()) {
    case nlohmann::json::value_t::null:
      return Value::none();
    case nlohmann::json::value_t::boolean:
      return Value::boolean(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value::integer(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      // Python's ints are unbounded; past int64 the value keeps its magnitude as a float.
      return u > static_cast<uint64_t>(INT64_MAX) ? Value::number(static_cast<double>(u))
                                                  : Value::integer(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value::number(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value::string(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& x : j) items.push_back(to_value(x, depth + 1));
      return Value::new_list(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Value d = Value::new_dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        d.dict->append(Value::string(it.key()), to_value(it.value(), depth + 1));
      return d;
    }
    default:
      throw Error("chat template context: unsupported JSON value");
  }
}

template <class J>
std::string render_with(const jinja::Template& t, const jinja::Options& opts, const J& context) {
  if (!context.is_object()) throw Error("chat template context must be a JSON object");
  std::vector<std::pair<std::string, jinja::Value>> globals;
  try {
    for (auto it = context.begin(); it != context.end(); ++it)
      globals.emplace_back(it.key(), to_value(it.value(), 1));
  } catch (const jinja::NestingError&) {
    throw Error("chat template context: JSON nests more than 512 levels deep");
  }
  return jinja::render(t, globals, opts);
}

}  // namespace

ChatTemplate::ChatTemplate(const std::string& source) : tpl_(jinja::parse(source)) {}

std::string ChatTemplate::render(const nlohmann::json& context) const {
  return render_with(*tpl_, opts_, context);
}

std::string ChatTemplate::render(const nlohmann::ordered_json& context) const {
  return render_with(*tpl_, opts_, context);
}

void ChatTemplate::set_clock(std::time_t t) {
  opts_.strftime_now = [t](const std::string& fmt) {
    std::tm tm{};
    gmtime_r(&t, &tm);
    return jinja::format_time(fmt, tm);
  };
}

std::string ChatTemplate::from_tokenizer_config(const nlohmann::ordered_json& config,
                                                const std::string& name) {
  if (!config.is_object() || !config.contains("chat_template"))
    throw Error("tokenizer config has no chat_template");
  const auto& ct = config["chat_template"];
  if (ct.is_string()) return ct.get<std::string>();
  if (ct.is_array()) {
    for (const auto& e : ct)
      if (e.is_object() && e.value("name", "") == name && e.contains("template") &&
          e["template"].is_string())
        return e["template"].get<std::string>();
    throw Error("tokenizer config has no chat_template named '" + name + "'");
  }
  throw Error("tokenizer config: chat_template must be a string or a list of {name, template}");
}

}  // namespace dory
