package natsservers

import (
	"errors"
	"fmt"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// authMaterial is what the server needs to check the credentials that
// makeAuth handed to clients.
type authMaterial struct {
	nkeyPub   string
	operator  *jwt.OperatorClaims
	accounts  map[string]string // account public key -> JWT
	systemAcc string
	// A second, unknown account's user: a well-formed .creds file the
	// server must refuse.
	badCredsFile string
	// An nkey the server does not know.
	badNkeySeedFile string
}

// makeAuth generates credentials and sets the client options.
func (s *Server) makeAuth(dir string) error {
	c := s.cfg
	n := 0
	for _, on := range []bool{c.user != "", c.token != "", c.nkey, c.creds} {
		if on {
			n++
		}
	}
	if n > 1 {
		return errors.New("at most one of user/password, token, nkey and creds")
	}
	switch {
	case c.user != "":
		s.ClientOptions = append(s.ClientOptions, natsgo.UserInfo(c.user, c.password))
	case c.token != "":
		s.ClientOptions = append(s.ClientOptions, natsgo.Token(c.token))
	case c.nkey:
		pub, seedFile, err := newNkeyUser(dir, "user.nk")
		if err != nil {
			return err
		}
		_, badSeed, err := newNkeyUser(dir, "stranger.nk")
		if err != nil {
			return err
		}
		s.auth.nkeyPub, s.NkeySeedFile, s.auth.badNkeySeedFile = pub, seedFile, badSeed
		opt, err := natsgo.NkeyOptionFromSeed(seedFile)
		if err != nil {
			return err
		}
		s.ClientOptions = append(s.ClientOptions, opt)
	case c.creds:
		if err := s.makeOperator(dir); err != nil {
			return err
		}
		s.ClientOptions = append(s.ClientOptions, natsgo.UserCredentials(s.CredsFile))
	}
	return nil
}

func newNkeyUser(dir, name string) (pub, seedFile string, err error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", "", err
	}
	pub, err = kp.PublicKey()
	if err != nil {
		return "", "", err
	}
	seed, err := kp.Seed()
	if err != nil {
		return "", "", err
	}
	seedFile, err = writeFile(dir, name, seed)
	return pub, seedFile, err
}

// makeOperator builds an operator, a system account, an application account
// with JetStream, and a user of it with a .creds file.
func (s *Server) makeOperator(dir string) error {
	okp, err := nkeys.CreateOperator()
	if err != nil {
		return err
	}
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	oc.Name = "natstest"
	ojwt, err := oc.Encode(okp)
	if err != nil {
		return err
	}
	if s.auth.operator, err = jwt.DecodeOperatorClaims(ojwt); err != nil {
		return err
	}
	s.auth.accounts = map[string]string{}
	account := func(name string, js bool) (nkeys.KeyPair, error) {
		akp, err := nkeys.CreateAccount()
		if err != nil {
			return nil, err
		}
		apub, _ := akp.PublicKey()
		ac := jwt.NewAccountClaims(apub)
		ac.Name = name
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		ajwt, err := ac.Encode(okp)
		if err != nil {
			return nil, err
		}
		s.auth.accounts[apub] = ajwt
		return akp, nil
	}
	sys, err := account("SYS", false)
	if err != nil {
		return err
	}
	s.auth.systemAcc, _ = sys.PublicKey()
	app, err := account("APP", true)
	if err != nil {
		return err
	}
	if s.CredsFile, err = userCreds(dir, "user.creds", app); err != nil {
		return err
	}
	// A user of an account the server never heard of.
	stranger, err := nkeys.CreateAccount()
	if err != nil {
		return err
	}
	s.auth.badCredsFile, err = userCreds(dir, "stranger.creds", stranger)
	return err
}

func userCreds(dir, name string, account nkeys.KeyPair) (string, error) {
	ukp, err := nkeys.CreateUser()
	if err != nil {
		return "", err
	}
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "natstest-user"
	ujwt, err := uc.Encode(account)
	if err != nil {
		return "", err
	}
	seed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, seed)
	if err != nil {
		return "", err
	}
	return writeFile(dir, name, creds)
}

func (s *Server) applyAuth(o *server.Options) error {
	c := s.cfg
	switch {
	case c.user != "" && c.perms != nil:
		o.Users = []*server.User{{Username: c.user, Password: c.password, Permissions: c.perms}}
	case c.user != "":
		o.Username, o.Password = c.user, c.password
	case c.token != "":
		o.Authorization = c.token
	case c.nkey:
		o.Nkeys = []*server.NkeyUser{{Nkey: s.auth.nkeyPub}}
	case c.creds:
		o.TrustedOperators = []*jwt.OperatorClaims{s.auth.operator}
		res := &server.MemAccResolver{}
		for pub, j := range s.auth.accounts {
			if err := res.Store(pub, j); err != nil {
				return fmt.Errorf("store account JWT: %w", err)
			}
		}
		o.AccountResolver = res
		o.SystemAccount = s.auth.systemAcc
	}
	return nil
}

// BadClientOptions are credentials of the configured kind that the server
// refuses: a wrong password or token, an unknown nkey, a .creds file of an
// unknown account. nil when the server has no authentication.
func (s *Server) BadClientOptions() ([]natsgo.Option, error) {
	var opts []natsgo.Option
	c := s.cfg
	switch {
	case c.user != "":
		opts = append(opts, natsgo.UserInfo(c.user, c.password+"-wrong"))
	case c.token != "":
		opts = append(opts, natsgo.Token(c.token+"-wrong"))
	case c.nkey:
		opt, err := natsgo.NkeyOptionFromSeed(s.auth.badNkeySeedFile)
		if err != nil {
			return nil, err
		}
		opts = append(opts, opt)
	case c.creds:
		opts = append(opts, natsgo.UserCredentials(s.auth.badCredsFile))
	default:
		return nil, nil
	}
	return append(opts, s.tlsClientOptions()...), nil
}
