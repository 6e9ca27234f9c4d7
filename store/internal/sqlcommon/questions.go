package sqlcommon

import (
	"context"
	"encoding/json"

	"github.com/runcue/runcue/store"
)

// applyQuestion applies the ops of the questions table; ok is false for
// any other op.
func applyQuestion(t Applier, op store.Op, r *store.Result) (ok bool, err error) {
	switch op := op.(type) {
	case *store.Ask:
		q := op.Question
		id := q.Nonce
		q.Nonce, q.Answer = "", nil
		data, _ := json.Marshal(q)
		r.Applied, err = t.Changed(`INSERT INTO questions(id, question, asked_at) VALUES(?, ?, ?) ON CONFLICT(id) DO NOTHING`,
			id, data, Nanos(op.At))
		return true, err
	case *store.AnswerQuestion:
		// An answer is never NULL once given: "null" says the owner had
		// none.
		answer := op.Answer
		if len(answer) == 0 {
			answer = []byte("null")
		}
		r.Applied, err = t.Changed(`UPDATE questions SET answer=? WHERE id=? AND answer IS NULL`, answer, op.ID)
		if err == nil && !op.Forget.IsZero() {
			err = t.Exec(`DELETE FROM questions WHERE asked_at < ? AND answer IS NOT NULL`, Nanos(op.Forget))
		}
		return true, err
	case *store.ForgetQuestion:
		r.Applied, err = t.Changed(`DELETE FROM questions WHERE id=?`, op.ID)
		return true, err
	}
	return false, nil
}

// Questions reads the questions not yet answered (sql selects id,
// question), oldest first.
func Questions(ctx context.Context, q Query, sql string) ([]store.OwnerQuestion, error) {
	var out []store.OwnerQuestion
	err := collect(ctx, q, sql, nil, func(r Rows) error {
		var id string
		var data []byte
		if err := r.Scan(&id, &data); err != nil {
			return err
		}
		var oq store.OwnerQuestion
		if json.Unmarshal(data, &oq) != nil {
			oq = store.OwnerQuestion{} // unreadable: answered with none
		}
		oq.Nonce = id
		out = append(out, oq)
		return nil
	})
	return out, err
}

// Answered reads a question's answer (sql selects answer of the id given
// as its one argument).
func Answered(ctx context.Context, q Query, sql, id string) ([]byte, bool, error) {
	var answer []byte
	var found bool
	err := collect(ctx, q, sql, []any{id}, func(r Rows) error {
		found = true
		return r.Scan(&answer)
	})
	if err != nil || !found || answer == nil {
		return nil, false, err
	}
	if string(answer) == "null" {
		return nil, true, nil
	}
	return answer, true, nil
}
