package storeurl

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Parameters every scheme takes; [Mux.Open] consumes them.
const (
	ParamCAFile       = "ca_file"
	ParamCertFile     = "cert_file"
	ParamKeyFile      = "key_file"
	ParamPasswordFile = "password_file"
	ParamTokenFile    = "token_file"
)

var commonParams = []string{ParamCAFile, ParamCertFile, ParamKeyFile, ParamPasswordFile, ParamTokenFile}

// Config is a parsed store URL with the [Options] resolved: what an
// [Opener] receives. It formats (fmt, log/slog) as the redacted URL.
type Config struct {
	// Scheme is the URL's scheme, in lower case.
	Scheme string
	// Hosts are the servers (host[:port]), in order; empty for a URL
	// without a host (mem://).
	Hosts []string
	// Path is the URL's unescaped path: "" or starting with '/'.
	Path string
	// Params are the driver's parameters: the URL's query and
	// Options.Params, without the common parameters.
	Params url.Values
	// User is the URL's user info, nil without one. Drivers read
	// Username and Password instead, except to give a lone user name a
	// meaning of their own (NATS reads it as a token).
	User *url.Userinfo
	// Username is Options.Username, else the URL's user name.
	Username string
	// Password is Options.Password, else the password_file's content,
	// else the URL's password.
	Password string
	// Token is Options.Token, else the token_file's content.
	Token string
	// TLS is the client TLS configuration from Options.TLS and the TLS
	// file parameters; nil when neither asks for TLS.
	TLS *tls.Config
	// DialTimeout bounds one dial of a client; never zero.
	DialTimeout time.Duration
	// Logger is Options.Logger, or one that discards; never nil.
	Logger *slog.Logger

	redacted string
}

// Redacted is the URL as given, with its secrets masked ([Redact]).
func (c *Config) Redacted() string { return c.redacted }

// String is [Config.Redacted].
func (c *Config) String() string { return c.redacted }

// GoString keeps %#v from printing the resolved secrets.
func (c *Config) GoString() string { return fmt.Sprintf("storeurl.Config(%q)", c.redacted) }

// LogValue logs the redacted URL.
func (c *Config) LogValue() slog.Value { return slog.StringValue(c.redacted) }

// Errorf returns an [Error] about the URL, which it names redacted.
func (c *Config) Errorf(format string, args ...any) error {
	return c.errorf(format, args...)
}

func (c *Config) errorf(format string, args ...any) error {
	e := fmt.Errorf(format, args...)
	return &Error{msg: fmt.Sprintf("store URL %q: %s", c.redacted, e), err: errors.Unwrap(e)}
}

// CheckParams refuses a parameter other than known, naming those the
// scheme takes.
func (c *Config) CheckParams(known ...string) error {
	var unknown []string
	for k := range c.Params {
		if !slices.Contains(known, k) {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	slices.Sort(unknown)
	takes := "no parameters of its own"
	if len(known) > 0 {
		takes = strings.Join(known, ", ")
	}
	return c.errorf("unknown parameter %s (%s:// takes %s; every scheme takes %s)",
		quoteAll(unknown), c.Scheme, takes, strings.Join(commonParams, ", "))
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// atAfterServer refuses an '@' past the server address: in a path or a
// query it is most likely the end of a password holding an unescaped '/'
// or '?', and the URL cannot be read as meant.
const atAfterServer = "an '@' after the server address (percent-escape @ : / , ? # in a user name or password, " +
	"and @ in a parameter, as %40)"

// parse splits rawURL into a Config, secrets unresolved.
func parse(raw string) (*Config, error) {
	c := &Config{redacted: Redact(raw)}
	scheme, rest, ok := strings.Cut(strings.TrimSpace(raw), "://")
	if !ok || scheme == "" {
		return nil, c.errorf("not a store URL: want scheme://host:port, such as etcd://127.0.0.1:2379, redis://127.0.0.1:6379 or mem://")
	}
	c.Scheme = strings.ToLower(scheme)
	// With an '@' in the text, any part of it may be a password holding
	// an unescaped reserved character: the errors then quote no part of
	// the URL but its redacted whole.
	hasAt := strings.Contains(raw, "@")
	if !schemeSyntax.MatchString(c.Scheme) {
		if hasAt {
			return nil, c.errorf("the scheme is not a URL scheme (want scheme://host:port)")
		}
		return nil, c.errorf("scheme %q is not a URL scheme", scheme)
	}
	if i := strings.IndexByte(rest, '#'); i >= 0 {
		return nil, c.errorf("a store URL takes no fragment (#...); escape a '#' in a password as %%23")
	}
	body, query, _ := strings.Cut(rest, "?")
	if strings.Contains(query, "@") {
		return nil, c.errorf("%s", atAfterServer)
	}
	// The authority ends at the first '/' of the last server; earlier
	// servers may be full URLs of their own ("nats://a:1,nats://b:2").
	items := strings.Split(body, ",")
	var userinfo string
	haveUser := false
	for i, item := range items {
		item = strings.TrimSpace(item)
		if i > 0 {
			if s, r, ok := strings.Cut(item, "://"); ok {
				if !strings.EqualFold(s, scheme) {
					if hasAt {
						return nil, c.errorf("servers of one URL share one scheme (percent-escape , in a user name or password)")
					}
					return nil, c.errorf("servers of one URL share one scheme: %q and %q", c.Scheme, strings.ToLower(s))
				}
				item = r
			}
		}
		host := item
		if j := strings.IndexByte(item, '/'); j >= 0 {
			if strings.Contains(item[j:], "@") {
				return nil, c.errorf("%s", atAfterServer)
			}
			if i < len(items)-1 {
				return nil, c.errorf("a path may follow only the last server")
			}
			host = item[:j]
			p, err := url.PathUnescape(item[j:])
			if err != nil {
				return nil, c.errorf("invalid %%-escape in the path")
			}
			c.Path = p
		}
		if at := strings.LastIndexByte(host, '@'); at >= 0 {
			ui := host[:at]
			host = host[at+1:]
			if i > 0 && !haveUser {
				// The servers before it would carry none: more likely a
				// password holding an unescaped ',' than a list.
				return nil, c.errorf("user info on a server after the first (write it on the first; percent-escape @ : / , ? # in a user name or password)")
			}
			if haveUser && ui != userinfo {
				return nil, c.errorf("servers of one URL share one set of credentials")
			}
			userinfo, haveUser = ui, true
		}
		if host == "" {
			continue
		}
		if u, err := url.Parse("//" + host); err != nil || u.Host != host || u.User != nil {
			if strings.Contains(raw, "@") {
				// It may be part of a password holding an unescaped
				// reserved character: do not show it.
				return nil, c.errorf("invalid server address (want host:port; percent-escape @ : / , ? # in a user name or password)")
			}
			return nil, c.errorf("invalid server address %q (want host:port)", host)
		}
		c.Hosts = append(c.Hosts, host)
	}
	if haveUser {
		u, err := url.Parse("x://" + userinfo + "@h")
		if err != nil || u.User == nil {
			return nil, c.errorf("invalid user info (percent-escape @ : / , ? # in a user name or password)")
		}
		c.User = u.User
	}
	params, err := url.ParseQuery(query)
	if err != nil {
		return nil, c.errorf("invalid query: want name=value pairs joined by '&', percent-escaped")
	}
	c.Params = params
	return c, nil
}

// resolve applies opts: credentials, the common parameters, TLS, the dial
// timeout and the logger.
func (c *Config) resolve(opts Options) error {
	for k, vs := range opts.Params {
		if _, dup := c.Params[k]; dup {
			return c.errorf("parameter %q is given twice (in the URL and in the options)", k)
		}
		c.Params[k] = slices.Clone(vs)
	}
	for k, vs := range c.Params {
		if len(vs) > 1 {
			return c.errorf("parameter %q is given %d times", k, len(vs))
		}
	}
	take := func(k string) string {
		v := c.Params.Get(k)
		c.Params.Del(k)
		return v
	}
	caFile, certFile, keyFile := take(ParamCAFile), take(ParamCertFile), take(ParamKeyFile)
	passwordFile, tokenFile := take(ParamPasswordFile), take(ParamTokenFile)

	if c.User != nil {
		c.Username = c.User.Username()
		c.Password, _ = c.User.Password()
	}
	if opts.Username != "" {
		c.Username = opts.Username
	}
	pw, err := firstSecret(opts.Password, Secret{File: passwordFile})
	if err != nil {
		return c.errorf("password: %w", err)
	}
	if pw != "" {
		c.Password = pw
	}
	if c.Token, err = firstSecret(opts.Token, Secret{File: tokenFile}); err != nil {
		return c.errorf("token: %w", err)
	}
	if c.TLS, err = LoadTLS(opts.TLS, caFile, certFile, keyFile); err != nil {
		return c.errorf("%w", err)
	}
	c.DialTimeout = opts.DialTimeout
	if c.DialTimeout <= 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	c.Logger = opts.Logger
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// firstSecret resolves the first of ss that yields a value.
func firstSecret(ss ...Secret) (string, error) {
	for _, s := range ss {
		v, err := s.Resolve()
		if err != nil || v != "" {
			return v, err
		}
	}
	return "", nil
}

// secretWords mark a query parameter whose value [Redact] masks.
var secretWords = []string{"pass", "pwd", "token", "secret", "key", "auth", "cred", "sig"}

// isSecretParam reports whether a query parameter's value may be a
// secret: its name suggests one, and it does not name a file or an
// environment variable holding it.
func isSecretParam(name string) bool {
	n := strings.ToLower(name)
	if strings.HasSuffix(n, "_file") || strings.HasSuffix(n, "_env") || n == "creds" {
		return false
	}
	for _, w := range secretWords {
		if strings.Contains(n, w) {
			return true
		}
	}
	return false
}

// Redact masks the secrets a store URL may carry, so that it can be
// printed, logged or recorded: the password of every server of a
// comma-separated list ("user:xxxxx@"), a user name that stands alone
// ("xxxxx@": NATS reads it as a token), and the value of every query
// parameter whose name suggests a secret (password, token, secret, key,
// auth, cred, sig; parameters naming a file are kept). It works on text
// that does not parse as a URL too, and never fails.
//
// Whatever characters a password holds, it is masked: the user info is
// taken to end at the last '@' of the text, so a password holding an
// unescaped '/', '?', '#', ',' or '@' (which a URL parser would read as
// a path, a query or another server) is masked with the rest of the user
// info. An '@' in a path or query value is therefore read as the end of
// a password too, and what comes before it is masked (such a URL is
// ambiguous; [Mux.Open] refuses it, asking for %40).
func Redact(raw string) string {
	start := 0 // where the user info may begin: after the first "://"
	if j := strings.Index(raw, "://"); j >= 0 {
		start = j + 3
	}
	at := strings.LastIndexByte(raw, '@')
	if at >= 0 && at < start {
		start = 0
	}
	if at < 0 {
		return redactQuery(raw, start)
	}
	var b strings.Builder
	b.WriteString(raw[:start])
	b.WriteString(redactUserinfos(raw[start:at]))
	queryFrom := b.Len()
	b.WriteString(raw[at:])
	return redactQuery(b.String(), queryFrom)
}

// redactUserinfos masks creds, the text of a URL from its first "://"
// to its last '@': the user info of one server, or a comma-separated
// list of servers that each carry the same user info
// ("u:p@a:1,nats://u:p"), which keeps the servers readable. Anything
// else is masked whole, but for the user name in front.
func redactUserinfos(creds string) string {
	if !strings.Contains(creds, ",") {
		return redactUserinfo(creds)
	}
	items := strings.Split(creds, ",")
	var ui string
	for i, item := range items {
		if k := strings.Index(item, "://"); i > 0 && k >= 0 && isScheme(item[:k]) {
			item = item[k+3:]
		}
		var u string
		if i == len(items)-1 {
			u = item // the last item ends at the last '@'
		} else {
			a := strings.LastIndexByte(item, '@')
			if a < 0 {
				return redactUserinfo(creds)
			}
			u = item[:a]
		}
		if i > 0 && u != ui {
			return redactUserinfo(creds)
		}
		ui = u
	}
	masked := redactUserinfo(ui)
	out := make([]string, len(items))
	for i, item := range items {
		prefix := ""
		if k := strings.Index(item, "://"); i > 0 && k >= 0 && isScheme(item[:k]) {
			prefix, item = item[:k+3], item[k+3:]
		}
		out[i] = prefix + masked + item[len(ui):]
	}
	return strings.Join(out, ",")
}

// redactUserinfo masks one server's user info: "user:xxxxx" when it has
// a password and a plain user name, else "xxxxx".
func redactUserinfo(ui string) string {
	user, _, hasPass := strings.Cut(ui, ":")
	if hasPass && !strings.ContainsAny(user, "/?#,@") {
		return user + ":xxxxx"
	}
	return "xxxxx"
}

// redactQuery masks the values of secret-looking query parameters, and
// the fragment, of the query that starts at the first '?' at or after
// from.
func redactQuery(out string, from int) string {
	q := strings.IndexByte(out[from:], '?')
	if q < 0 {
		return out
	}
	q += from
	query, _, hasFrag := strings.Cut(out[q+1:], "#")
	pairs := strings.Split(query, "&")
	for i, kv := range pairs {
		k, _, hasValue := strings.Cut(kv, "=")
		name, err := url.QueryUnescape(k)
		if err != nil {
			name = k
		}
		if hasValue && isSecretParam(name) {
			pairs[i] = k + "=xxxxx"
		}
	}
	out = out[:q+1] + strings.Join(pairs, "&")
	if hasFrag {
		out += "#xxxxx"
	}
	return out
}

// isScheme reports whether s is a URL scheme's syntax.
func isScheme(s string) bool {
	if s == "" {
		return false
	}
	for i := range len(s) {
		if !isSchemeByte(s[i]) {
			return false
		}
	}
	return true
}

func isSchemeByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '+' || c == '-' || c == '.'
}
