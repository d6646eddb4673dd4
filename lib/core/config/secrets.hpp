// Credentials in the values rankscope reads (MASTER_ADDR as "user:pw@host",
// an OTLP endpoint "http://user:pw@collector:4318", any URL in a knob) never
// reach an identifier, a label, a file or the console: they are cut out where
// the value is read. Only the OTLP sender keeps the endpoint as configured,
// since that is where the user sent them. Pure functions; cold path only.
#pragma once

#include <string>
#include <string_view>

namespace rankscope::detail {

/// `value` without the user information of any URL or address in it:
/// "http://u:pw@h:4318/v1" -> "http://h:4318/v1", "user:pw@node1" -> "node1",
/// "a,https://tok@h" -> "a,https://h". A scheme-less "name@host" without a
/// password (an e-mail address) is left as it is.
std::string strip_userinfo(std::string_view value);

/// True for variable names that look like credentials (TOKEN, SECRET,
/// PASSWORD, KEY, AUTH, HEADERS, ...): their values never leave the process.
bool looks_secret(std::string_view name);

/// The value of variable `name` as it may be shown or stored: "<redacted>"
/// for a secret's, otherwise without user information (strip_userinfo).
std::string shown_value(std::string_view name, std::string_view value);

}  // namespace rankscope::detail
